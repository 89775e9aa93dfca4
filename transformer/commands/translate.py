"""Translate Portuguese sentences with a training run or an exported SavedModel.

    python scripts/translate.py --model runs/bible "No princípio, Deus criou os céus e a terra."
    echo "Deus é amor." | python scripts/translate.py --model exports/bible
    python scripts/translate.py --model runs/bible --file sentences.pt --beam 4 > out.en
    python scripts/translate.py --model runs/bible "Deus é amor." --plot-attention attention.png

--model is either a run directory (config.json + checkpoints/) or an export (saved_model.pb);
decoding flags (--beam, --xla, …) apply to run directories, an export decodes as exported.
Sentences come from the arguments, else --file, else stdin (one per line). One translation
per input line is printed, in order.
"""

import argparse
import sys
from pathlib import Path

from transformer.base import cli
from transformer.base.errors import command


def read_sentences(args) -> list[str]:
    if args.sentences:
        return list(args.sentences)
    if args.file:
        data = Path(args.file).read_bytes()
    else:
        data = sys.stdin.buffer.read()
    # errors="replace": a bad byte must not stop the batch (the translator sanitises too).
    return data.decode("utf-8", errors="replace").splitlines()


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --file or stdin)")
    parser.add_argument("--model", required=True, help="run directory or exported SavedModel")
    cli.add_checkpoint_arg(parser)
    parser.add_argument("--file", help="read sentences from this file, one per line")
    parser.add_argument("--plot-attention", metavar="PNG",
                        help="draw the cross-attention heatmap of the first sentence to this file")
    parser.add_argument("--head", type=int, help="plot one attention head (default: mean over heads)")
    cli.add_decode_args(parser)
    args = parser.parse_args(argv)
    cli.start()

    from transformer.inference.export import open_translator

    sentences = read_sentences(args)
    translator = open_translator(args.model, cli.decode_config_from_args(args), args.checkpoint)
    for line in translator.translate(sentences):
        print(line)
    if args.plot_attention and sentences:
        from transformer.measure.attention_plot import attention_for_sentence, plot_attention

        weights, source, target, translation = attention_for_sentence(translator.attention(sentences[:1]), 0, args.head)
        path = plot_attention(weights, source, target, args.plot_attention,
                              title=f"{sentences[0]}\n→ {translation}")
        print(f"attention heatmap: {path}", file=sys.stderr)
    return 0



if __name__ == "__main__":
    sys.exit(main())
