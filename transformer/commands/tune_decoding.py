"""Choose decoding settings by measurement: length-penalty grid, then greedy vs beam speed.

    python scripts/tune_decoding.py --run runs/bible --checkpoint best --beams 4 --alphas 0 0.6 1.0 \
        --exported --output runs/bible/decoding_tuning.json

1. Quality: BLEU/chrF on the split (default: the shared Bible corpus' validation pairs) of
   greedy and of every --beams × --alphas pair (in-memory Translator).
2. Speed: greedy and each beam size at its best alpha, on the first --speed-sentences
   sentences, timed in --rounds interleaved rounds in this one process, in memory and — with --exported — through
   SavedModels exported with those settings (scripts/export.py's path), whose translations
   must equal the in-memory ones. Reports each beam's BLEU gain and its sentences/s as a
   fraction of greedy's.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

from transformer.base import cli
from transformer.base.config import DecodeConfig
from transformer.base.errors import command


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_run_split_args(parser)
    parser.add_argument("--limit", type=int, help="use only the first N pairs")
    parser.add_argument("--beams", type=int, nargs="+", default=[4], help="beam sizes (> 1) to compare with greedy")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.6, 1.0], help="length-penalty grid")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds (default 2; 0: no timing)")
    parser.add_argument("--speed-sentences", type=int, default=256,
                        help="time decoding on the first N sentences of the split (default 256)")
    parser.add_argument("--exported", action="store_true", help="also time SavedModels exported with each setting")
    parser.add_argument("--grid", action=argparse.BooleanOptionalAction, default=True,
                        help="score the length-penalty grid first (default); --no-grid times each beam at the "
                             "first --alphas value and scores only the timed sentences")
    parser.add_argument("--xla", action=argparse.BooleanOptionalAction, default=DecodeConfig.jit_compile,
                        help="compile the decode loop with XLA")
    parser.add_argument("--output", help="JSON report (default <run>/decoding_tuning.json)")
    args = parser.parse_args(argv)
    if any(k < 2 for k in args.beams) or any(a < 0 for a in args.alphas):
        parser.error("--beams must be >= 2 and --alphas >= 0")
    cli.start()

    import tensorflow as tf

    from transformer.data.corpora import load_split
    from transformer.inference.decode_tuning import best_alpha, decoder_name, interleaved_speed, quality_grid, wall_clock
    from transformer.inference.evaluation import save_report, score
    from transformer.inference.export import export_translator, load_exported
    from transformer.inference.rundir import translator_from_run
    from transformer.runtime.precision import cpu_facts, cpu_id

    sources, references = load_split(data_dir=args.data, split=args.split, limit=args.limit)
    translator = translator_from_run(args.run, DecodeConfig(jit_compile=args.xla), args.checkpoint)
    started = wall_clock()
    grid = quality_grid(translator, sources, references, beams=args.beams, alphas=args.alphas) if args.grid else []
    print(json.dumps([{k: row[k] for k in ("name", "bleu", "chrf")} for row in grid], indent=1), flush=True)

    chosen = {"greedy": translator}
    for k in args.beams:
        alpha = best_alpha(grid, k) if args.grid else args.alphas[0]
        chosen[decoder_name(k, alpha)] = translator.with_config(beam_size=k, alpha=alpha)
    decoders = {name: t.translate_with_lengths for name, t in chosen.items()}
    with tempfile.TemporaryDirectory(prefix="tune-decoding-") as tmp:
        if args.exported:
            for name, t in chosen.items():
                path = export_translator(t, Path(tmp) / name.replace(" ", "").replace(",", "-"))
                decoders[f"{name} (exported)"] = load_exported(path).translate_with_lengths
        timed = sources[:args.speed_sentences]
        speed = interleaved_speed(decoders, timed, rounds=args.rounds) if args.rounds else {}
    bleu = {row["name"]: row["bleu"] for row in grid}
    if not args.grid:  # BLEU of the timed sentences only
        bleu = {name: score(entry["translations"], references[:len(timed)])["bleu"]
                for name, entry in speed.items() if not name.endswith("(exported)")}
    summary = []
    for name, entry in speed.items():
        base = name.replace(" (exported)", "")
        greedy = speed["greedy (exported)" if name.endswith("(exported)") else "greedy"]
        summary.append({"decoder": name, "bleu": bleu[base], "bleu_gain": round(bleu[base] - bleu["greedy"], 2),
                        "sentences_per_s": entry["sentences_per_s"],
                        "fraction_of_greedy": round(entry["sentences_per_s"] / greedy["sentences_per_s"], 3),
                        "rounds_s": entry["rounds_s"]})
        if name.endswith("(exported)") and entry["translations"] != speed[base]["translations"]:
            raise RuntimeError(f"{name}: the export translates differently from the in-memory Translator")
    report = {
        "run": str(Path(args.run).resolve()), "checkpoint": args.checkpoint, "data": f"{args.data} ({args.split})",
        "num_sentences": len(sources), "bleu_on": "all sentences" if args.grid else "the timed sentences",
        "speed_sentences": min(len(sources), args.speed_sentences), "xla": args.xla, "started": started, "finished": wall_clock(),
        "command": "python scripts/tune_decoding.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": cpu_facts()[0], "cpu_id": cpu_id(),
                    "tensorflow": tf.__version__, "load_average": os.getloadavg()},
        "quality_grid": grid, "speed": summary,
        "speed_detail": {name: {k: v for k, v in entry.items() if k != "translations"} for name, entry in speed.items()},
    }
    output = Path(args.output) if args.output else Path(args.run) / "decoding_tuning.json"
    save_report(report, output)
    for row in summary:
        print(f"{row['decoder']:<36} BLEU {row['bleu']:6.2f} ({row['bleu_gain']:+.2f})  "
              f"{row['sentences_per_s']:7.2f} sentences/s = {row['fraction_of_greedy']:.2f} x greedy")
    print(f"report: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
