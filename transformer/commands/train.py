"""Train the pt→en Transformer.

    python scripts/train.py --data ../shared/data/bible-pt-en --time-budget 30 --output runs/bible
    python scripts/train.py --data ../shared/data/bible-pt-en --preset tutorial --pipeline naive  # the TF tutorial
    python scripts/train.py --device gpu --mixed-precision float16 --xla   # TFDS TED default
    python scripts/train.py --strategy mirrored --max-tokens 4096 --backup-every-steps 500  # all local GPUs
    # on every machine, with its own TF_CONFIG task index (see docs/devices.md):
    TF_CONFIG="$(cat tf_config.json)" python scripts/train.py --strategy multi-worker --output /shared/runs/big

See docs/training.md for every flag; the effective config is printed and saved as config.json.
"""

import argparse
import json
import sys

from transformer.base import cli
from transformer.base.allocator import use_caching_allocator
from transformer.base.errors import command


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_data_args(parser)
    cli.add_tokenizer_args(parser)
    cli.add_model_args(parser)
    cli.add_pipeline_args(parser)
    cli.add_train_args(parser)
    return parser.parse_args(argv)


@command
def main(argv=None) -> int:
    args = parse_args(argv)
    cli.start()
    use_caching_allocator()  # before TensorFlow starts: its caching CPU allocator, unless the user chose
    config = cli.run_config_from_args(args)
    print("effective config:\n" + json.dumps(config.to_dict(), indent=2))

    from transformer.training.trainer import train  # imports TensorFlow + tensorflow-text

    result = train(config)
    print("\nsummary:\n" + json.dumps(result.summary, indent=2))
    print(f"run directory: {result.output_dir}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
