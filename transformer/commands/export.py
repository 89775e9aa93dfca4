"""Export a trained run as a self-contained SavedModel (tokenizers inside).

    python scripts/export.py --run runs/bible --output exports/bible
    python scripts/export.py --run runs/bible --output exports/bible-beam4 --beam 4 --xla

Signature `serving_default`: {"sentences": tf.string [batch]} → {"translations": tf.string [batch]}
(plus an `attention` signature; see transformer/inference/export.py). Check it with
    saved_model_cli show --dir exports/bible --all
"""

import argparse
import json
import sys
from pathlib import Path

from transformer.base import cli
from transformer.base.errors import command


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="training run directory (config.json, tokenizers/, checkpoints/)")
    cli.add_checkpoint_arg(parser)
    parser.add_argument("--output", required=True, help="SavedModel directory to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    cli.add_decode_args(parser)
    args = parser.parse_args(argv)
    cli.start()
    config = cli.decode_config_from_args(args)

    from transformer.inference.export import export_translator
    from transformer.inference.rundir import translator_from_run

    translator = translator_from_run(args.run, config, args.checkpoint)
    path = export_translator(translator, args.output, overwrite=args.overwrite,
                             extra={"run_dir": str(Path(args.run).resolve())})
    print(json.dumps({"export": str(path), "decode": config.to_dict()}, indent=2))
    print(f"try: saved_model_cli show --dir {path} --tag_set serve --signature_def serving_default")
    return 0



if __name__ == "__main__":
    sys.exit(main())
