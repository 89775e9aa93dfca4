"""Learn the subword vocabularies (WordPiece, or SentencePiece with --tokenizer sentencepiece) and save the
tokenizer SavedModel, without training.

    python scripts/build_tokenizers.py --data ../shared/data/bible-pt-en --vocab-size 8000

Prints the directory (tokenizers/<key>/); an existing directory for the same inputs is reused.
"""

import argparse
import sys

from transformer.base import cli
from transformer.base.errors import command


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_data_args(parser)
    cli.add_tokenizer_args(parser)
    args = parser.parse_args(argv)
    cli.start()
    config = cli.run_config_from_args(args)

    from transformer.data.corpora import load_corpus
    from transformer.data.tokenizer import build_or_load_tokenizers

    tokenizers, directory = build_or_load_tokenizers(load_corpus(config.data), config.tokenizer)
    print(f"{directory}  (src vocab {int(tokenizers.src.get_vocab_size())}, "
          f"tgt vocab {int(tokenizers.tgt.get_vocab_size())})")
    return 0



if __name__ == "__main__":
    sys.exit(main())
