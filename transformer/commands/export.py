"""Export a trained run as a self-contained SavedModel (tokenizers inside).

    python scripts/export.py --run runs/bible --output exports/bible
    python scripts/export.py --run runs/bible --output exports/bible-beam4 --beam 4 --xla
    python scripts/export.py --run runs/bible --output exports/bible-ct2 --format ctranslate2

Signature `serving_default`: {"sentences": tf.string [batch]} → {"translations": tf.string [batch]}
(plus an `attention` signature; see transformer/inference/export.py). Check it with
    saved_model_cli show --dir exports/bible --all

`--format ctranslate2` writes the same weights as a CTranslate2 model directory instead
(greedy decoding with our tokenizers; transformer/inference/ctranslate2_export.py).
"""

import argparse
import json
import sys
from pathlib import Path

from transformer.base import cli
from transformer.base.errors import ConfigError, command

EXPORT_FORMATS = ("savedmodel", "ctranslate2")
EXPORT_DTYPES = ("float32", "bfloat16")


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="training run directory (config.json, tokenizers/, checkpoints/)")
    cli.add_checkpoint_arg(parser)
    parser.add_argument("--output", required=True, help="SavedModel directory to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--format", choices=EXPORT_FORMATS, default=EXPORT_FORMATS[0],
                        help="savedmodel (default: TensorFlow, tokenizers inside) or ctranslate2 (a CTranslate2 "
                             "model directory + our tokenizers; needs the ctranslate2 package; --beam runs "
                             "CTranslate2's beam search, its scores normalised by length ** --alpha)")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default=EXPORT_DTYPES[0],
                        help="SavedModel weights and compute: float32 (default) or bfloat16 (for CPUs with "
                             "avx512_bf16/amx_bf16; logits stay float32)")
    cli.add_decode_args(parser)
    args = parser.parse_args(argv)
    cli.start()
    config = cli.decode_config_from_args(args)
    if args.format == "ctranslate2" and args.dtype != "float32":
        raise ConfigError(f"--dtype {args.dtype}: --format ctranslate2 stores float32 weights (choose the compute "
                          "type when loading: CTranslate2Translator(compute_type=...))")

    if args.format == "ctranslate2":
        from transformer.inference.ctranslate2_export import export_run_ctranslate2

        path = export_run_ctranslate2(args.run, args.output, checkpoint=args.checkpoint, config=config,
                                      overwrite=args.overwrite)
        print(json.dumps({"export": str(path), "format": "ctranslate2"}, indent=2))
        print(f"try: python scripts/benchmark_decoding.py --run {args.run} --compare ctranslate2")
        return 0

    from transformer.inference.export import export_translator
    from transformer.inference.rundir import translator_from_run

    translator = translator_from_run(args.run, config, args.checkpoint, dtype=args.dtype)
    path = export_translator(translator, args.output, overwrite=args.overwrite,
                             extra={"run_dir": str(Path(args.run).resolve()), "dtype": args.dtype})
    print(json.dumps({"export": str(path), "decode": config.to_dict()}, indent=2))
    print(f"try: saved_model_cli show --dir {path} --tag_set serve --signature_def serving_default")
    return 0



if __name__ == "__main__":
    sys.exit(main())
