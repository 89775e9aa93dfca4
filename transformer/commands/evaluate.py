"""Score a model (sacrebleu BLEU + chrF) and measure its decoding speed; writes JSON.

    python scripts/evaluate.py --model runs/bible --data ../shared/data/bible-pt-en --split validation
    python scripts/evaluate.py --model exports/bible --dataset ted_hrlr_translate/pt_to_en --split test
    python scripts/evaluate.py --model runs/bible --src test.pt --ref test.en --beam 4 --output eval.json

The report goes to --output, by default into the model's directory: `<model>/eval_<split>.json`
(`eval_<source file name>.json` with --src), so it stays with the model it scores.

--model is a run directory or an export, SavedModel or CTranslate2 (see scripts/translate.py). Speed: one cold pass
(tracing/compilation included) then --repeats warm passes; the report's `speed` is the best
warm pass. See transformer/inference/evaluation.py.
"""

import argparse
import json
import sys
from pathlib import Path

from transformer.base import cli
from transformer.base.errors import command
from transformer.runtime.onednn import configure_onednn, onednn_state


def default_report_path(model: str, split: str, src=None) -> Path:
    """Where a report goes without --output: `<model>/eval_<split>.json`, or `eval_<src's name>.json`."""
    return Path(model) / f"eval_{Path(src).name if src else split.replace('/', '_')}.json"


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="run directory, SavedModel export or CTranslate2 export")
    cli.add_checkpoint_arg(parser)
    data = parser.add_argument_group("evaluation data (one of)")
    data.add_argument("--src", help="source file, one sentence per line (with --ref)")
    data.add_argument("--ref", help="reference translations, line-aligned with --src")
    data.add_argument("--data", dest="data_dir", help="directory with {split}.pt / {split}.en")
    data.add_argument("--dataset", help="TFDS dataset, e.g. ted_hrlr_translate/pt_to_en")
    data.add_argument("--tfds-data-dir")
    data.add_argument("--split", default="test", help="split name (default test)")
    data.add_argument("--limit", type=int, help="evaluate the first N pairs only")
    parser.add_argument("--repeats", type=int, default=1, help="warm timing passes after the cold one (default 1)")
    parser.add_argument("--output", help="JSON report path (default <model>/eval_<split>.json, "
                                         "with --src <model>/eval_<its file name>.json)")
    cli.add_decode_args(parser)
    cli.add_thread_args(parser)
    cli.add_compute_type_arg(parser)
    args = parser.parse_args(argv)
    cli.check_thread_args(args)
    config = cli.decode_config_from_args(args)
    cli.start()
    configure_onednn(args.onednn, cli.model_dtype(args.model))  # before TensorFlow loads

    from transformer.data.corpora import load_split
    from transformer.inference.evaluation import evaluate, save_report
    from transformer.inference.export import configure_decoding_threads, open_translator

    threads = configure_decoding_threads(args.model, config, intra_op=args.intra_op_threads,
                                         inter_op=args.inter_op_threads)

    sources, references = load_split(
        src_file=args.src, ref_file=args.ref, data_dir=args.data_dir, split=args.split, dataset=args.dataset,
        tfds_data_dir=args.tfds_data_dir, limit=args.limit)
    translator = open_translator(args.model, config, args.checkpoint, args.compute_type)
    description = {
        "model": str(Path(args.model).resolve()),
        "data": args.src or args.data_dir or args.dataset,
        "split": None if args.src else args.split,
        "decode": getattr(translator, "config", None) and translator.config.to_dict(),
        "exported_decode": getattr(translator, "manifest", {}).get("decode"),
        "ctranslate2": getattr(translator, "compute_type", None) and {"compute_type": translator.compute_type,
                                                                    **translator.threads},
        "threads": threads.to_dict(),
        "onednn": onednn_state(),
        "command": " ".join(sys.argv),
    }
    report = evaluate(translator.translate_with_lengths, sources, references, repeats=args.repeats,
                      description=description)
    output = args.output or default_report_path(args.model, args.split, args.src)
    save_report(report, output)
    summary = {k: report[k] for k in ("num_sentences", "bleu", "bleu_lowercase", "chrf", "speed", "speed_cold")}
    print(json.dumps(summary, indent=2))
    print(f"report: {output}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
