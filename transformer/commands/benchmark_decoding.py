"""Decoding speed: cached batched greedy vs the TF tutorial's batch-1 uncached loop.

    python scripts/benchmark_decoding.py --run runs/bible
    python scripts/benchmark_decoding.py --run runs/bible --xla --baseline-sentences 100
    python scripts/benchmark_decoding.py --run runs/bible --compare ctranslate2 --chunk-size 64

Trains nothing. Translates the validation split (default: the shared Bible corpus) with the
run's model twice: (1) cached, batched, length-sorted greedy decoding (transformer/inference/translator.py),
all sentences; (2) the tutorial Translator's design — one sentence at a time, the whole model
re-run on the full prefix every step — on the first --baseline-sentences sentences. Prints
and saves (JSON) both rates and the speed-up.

`--compare ctranslate2` instead times our exported SavedModel (and the variants named by
--ours) against the same weights converted to CTranslate2 (float32 and int8 by default,
--ct2-compute-types), all fed by our tokenizers, interleaved in one process: sentences/s and
generated tokens/s side by side, ratios to the first engine, and how many translations are
identical to its. The report goes to <run>/decoding_comparison.json.

`--streams-probe` times concurrent decoding streams of one model (`--dtype`): at each of
--chunk-sizes B and each of --streams S, (1) one export called by S threads at once, each
call a length-sorted batch of B sentences (a server with S decoder threads), and (2) an
export with chunk_size B decoding S chunks at once in its own graph (`DecodeConfig.streams`),
interleaved in one process; ratios to the first. Report: <run>/decoding_streams.json.
"""

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from transformer.base import cli
from transformer.base.config import DecodeConfig
from transformer.base.errors import ConfigError, command
from transformer.runtime.cpu_budget import cpu_budget
from transformer.runtime.onednn import configure_onednn

ONEDNN_STATE = {True: "on", False: "off", None: "unknown"}  # runtime.onednn.onednn_enabled()
OURS = ("export", "in-memory", "export-xla", "export-no-xla", "export-bf16", "export-bf16-xla", "export-beam4",
        "export-bf16-beam4")


@command
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_run_split_args(parser)
    parser.add_argument("--limit", type=int, help="use only the first N sentences for the cached side")
    parser.add_argument("--baseline-sentences", type=int, default=50,
                        help="sentences translated by the slow batch-1 uncached loop (default 50)")
    parser.add_argument("--chunk-size", type=int, default=128, help="sentences per cached batch (default 128)")
    parser.add_argument("--xla", action=argparse.BooleanOptionalAction, default=DecodeConfig().jit_compile,
                        help="XLA-compile the cached decode loop (default: off, as the Translator's DecodeConfig)")
    parser.add_argument("--repeats", type=int, default=1, help="warm passes of the cached side (default 1)")
    parser.add_argument("--output", help="JSON report (default <run>/decoding_benchmark.json, or "
                                          "<run>/decoding_comparison.json with --compare)")
    parser.add_argument("--compare", choices=["ctranslate2"],
                        help="time our decoder against CTranslate2 on the same weights (see above)")
    parser.add_argument("--ours", nargs="+", choices=OURS, default=["export"],
                        help="our engines with --compare: export (the SavedModel, --xla as given), in-memory "
                             "(the Translator), export-xla / export-no-xla (the SavedModel with XLA on/off), export-bf16 / "
                             "export-bf16-xla (bfloat16 weights and compute, float32 logits), export-beam4 / export-bf16-beam4 "
                             "(beam search, 4 beams, --xla as given). "
                             "The first is the reference. Default: export")
    parser.add_argument("--exports", nargs="+", default=[], metavar="DIR",
                        help="with --compare, also time these SavedModels (e.g. exported by another commit of this "
                             "repository from the same run), after --ours")
    parser.add_argument("--ct2-compute-types", nargs="+", default=["float32", "int8"],
                        help="CTranslate2 compute types with --compare (default: float32 int8)")
    parser.add_argument("--threads", type=int, default=cpu_budget().cpus,
                        help="CTranslate2 threads per translation with --compare (default: every usable CPU, "
                             "the affinity mask capped by a cgroup CPU quota)")
    parser.add_argument("--streams", type=int, nargs="+", default=[DecodeConfig().streams],
                        help="with --compare: export each of our engines with each of these DecodeConfig.streams "
                             "(chunks decoded at once); with --streams-probe: the streams compared (default "
                             f"{DecodeConfig().streams}, as exports)")
    parser.add_argument("--ct2-inter-threads", type=int, nargs="+", default=[1],
                        help="with --compare: CTranslate2 inter_threads settings (batches decoded at once), each "
                             "with --threads / inter_threads intra-op threads (default 1)")
    parser.add_argument("--ct2-beam-sizes", type=int, nargs="+", default=[1],
                        help="with --compare: CTranslate2 beam sizes (1: greedy; beam search with the run's "
                             f"DecodeConfig alpha, {DecodeConfig().alpha:g} by default, as CTranslate2's "
                             "length ** alpha normaliser) (default 1)")
    parser.add_argument("--streams-probe", action="store_true",
                        help="instead, time concurrent decoding streams (see above) into <run>/decoding_streams.json")
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[16, 32, 64],
                        help="batch sizes with --streams-probe (default 16 32 64)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="with --profile or --streams-probe: the model's weights and compute (as `export.py --dtype`; "
                             "default float32)")
    parser.add_argument("--profile", action="store_true",
                        help="instead, break our decoding's time down (tokenize, encoder, decoder layers, "
                             "projection, cache updates, token selection, loop overhead, "
                             "detokenize; without XLA) into <run>/decoding_profile.json")
    parser.add_argument("--beam", type=int, default=1, help="with --profile: beam size (default 1: greedy)")
    cli.add_thread_args(parser)
    args = parser.parse_args(argv)
    cli.check_thread_args(args)
    cli.start()
    configure_onednn(args.onednn, _timed_dtype(args))  # before TensorFlow loads
    if sum(map(bool, (args.compare, args.profile, args.streams_probe))) > 1:
        raise ConfigError("--compare, --profile and --streams-probe: choose one")
    for flag in ("streams", "ct2_inter_threads", "ct2_beam_sizes", "chunk_sizes"):
        if min(getattr(args, flag)) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {min(getattr(args, flag))}")
    if not args.profile and args.beam != 1:
        raise ConfigError(f"--beam {args.beam}: given with --profile only")
    if not (args.profile or args.streams_probe) and args.dtype != "float32":
        raise ConfigError(f"--dtype {args.dtype}: given with --profile or --streams-probe only")
    if args.beam < 1:
        raise ConfigError(f"--beam {args.beam}: must be >= 1")
    _configure_threads(args)
    if args.compare:
        return _compare(args, argv)
    if args.profile:
        return _profile(args, argv)
    if args.streams_probe:
        return _streams_probe(args, argv)

    import tensorflow as tf

    from transformer.data.corpora import load_split
    from transformer.inference.evaluation import benchmark_decoding, save_report
    from transformer.inference.rundir import translator_from_run

    sources, references = load_split(data_dir=args.data, split=args.split, limit=args.limit)
    translator = translator_from_run(args.run, DecodeConfig(chunk_size=args.chunk_size, jit_compile=args.xla),
                                     args.checkpoint)
    started = time.perf_counter()
    report = benchmark_decoding(translator, sources, references, baseline_sentences=args.baseline_sentences,
                                repeats=args.repeats)
    report.update(_provenance(args, argv, tf, started))
    output = Path(args.output) if args.output else Path(args.run) / "decoding_benchmark.json"
    save_report(report, output)
    cached, base = report["cached_batched"]["warm"], report["uncached_batch1"]
    print(json.dumps({k: report[k] for k in ("cached_batched", "uncached_batch1", "cached_batched_on_baseline_subset",
                                             "cached_batched_unbounded_on_baseline_subset",
                                             "cached_batch1_on_baseline_subset",
                                             "identical_to_uncached_when_unbounded",
                                             "identical_to_uncached_with_bound")
                      if k in report}, indent=2))
    print(f"cached batched greedy: {cached['sentences_per_s']:.2f} sentences/s ({report['num_sentences']} sentences)")
    print(f"tutorial batch-1 uncached loop: {base['sentences_per_s']:.3f} sentences/s "
          f"(first {base['sentences']} sentences)")
    print(f"speed-up: {report['speedup']}x (cold, compilation included: {report['speedup_cold']}x; "
          f"same {base['sentences']} sentences: {report['speedup_same_subset']}x, and without the "
          f"output-length bound: {report['speedup_same_subset_unbounded']}x)")
    print(f"report: {output}")
    return 0


def _configure_threads(args):
    """TensorFlow's pools for our engines, one setting per process: those of the most --streams
    (`runtime.threads.decoding_threads`), unless --intra-op-threads / --inter-op-threads say."""
    from transformer.runtime.threads import configure_threads, decoding_threads

    return configure_threads(decoding_threads(max(args.streams), intra_op=args.intra_op_threads,
                                              inter_op=args.inter_op_threads))


def _provenance(args, argv, tf, started: float) -> dict:
    """What every decoding report records: the run, data, command, machine, TensorFlow's thread
    pools and wall time since `started`."""
    from transformer.runtime.onednn import onednn_state
    from transformer.runtime.threads import current_threads

    return {
        "threads": current_threads().to_dict(),
        "onednn": onednn_state(),
        "run": str(Path(args.run).resolve()),
        "data": f"{args.data} ({args.split})",
        "command": "python scripts/benchmark_decoding.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": _machine(tf),
        "wall_time_s": round(time.perf_counter() - started, 1),
    }


def _timed_dtype(args) -> str:
    """bfloat16 when any engine this run times computes in bfloat16 (`--onednn auto` then keeps
    TensorFlow's choice), else float32."""
    dtypes = {args.dtype if (args.profile or args.streams_probe) else "float32"}
    if args.compare:
        dtypes |= {"bfloat16" for name in args.ours if "bf16" in name}
        dtypes |= {cli.model_dtype(path) for path in args.exports}
    return "float32" if dtypes == {"float32"} else "bfloat16"


def _machine(tf) -> dict:
    from transformer.runtime.precision import cpu_facts, cpu_id

    model, flags = cpu_facts()
    return {"cpu": model, "cpu_id": cpu_id(), "cpus": os.cpu_count(), "cpu_budget": cpu_budget().to_dict(),
            "platform": platform.platform(),
            "bf16_instructions": sorted(f for f in flags if f in ("avx512_bf16", "amx_bf16")),
            "load_average": [round(x, 2) for x in os.getloadavg()], "tensorflow": tf.__version__,
            "gpus": len(tf.config.list_physical_devices("GPU"))}


def _profile(args, argv) -> int:
    """--profile: the time breakdown of our decoding (transformer/inference/decode_profile.py)."""
    import tensorflow as tf

    from transformer.data.corpora import load_split
    from transformer.inference.decode_profile import decode_time_breakdown, format_breakdown
    from transformer.inference.evaluation import save_report
    from transformer.inference.rundir import translator_from_run

    sources, _ = load_split(data_dir=args.data, split=args.split, limit=args.limit)
    translator = translator_from_run(args.run, DecodeConfig(chunk_size=args.chunk_size, beam_size=args.beam),
                                     args.checkpoint, dtype=args.dtype)
    started = time.perf_counter()
    report = decode_time_breakdown(translator, sources, repeats=max(args.repeats, 1))
    report.update(_provenance(args, argv, tf, started))
    report["dtype"] = args.dtype
    report.update({
        "model": {k: getattr(translator.model.config, k) for k in translator.model.config.__dataclass_fields__},
        "table": format_breakdown(report),
    })
    output = Path(args.output) if args.output else Path(args.run) / "decoding_profile.json"
    save_report(report, output)
    print(report["table"])
    print(f"{report['steps']} decoder steps in {report['chunks']} chunks of up to {report['chunk_size']}: "
          f"{report['per_step_ms']} ms per step")
    print(f"report: {output}")
    return 0


def _streams_probe(args, argv) -> int:
    """--streams-probe: 1 vs N concurrent decoding streams, by threads and inside the export."""
    import tempfile

    import tensorflow as tf

    from transformer.data.corpora import load_split
    from transformer.inference.evaluation import compare_engines, comparison_table, concurrent_calls, save_report
    from transformer.inference.export import export_translator, load_exported
    from transformer.inference.rundir import translator_from_run

    sources, _ = load_split(data_dir=args.data, split=args.split, limit=args.limit)
    translator = translator_from_run(args.run, DecodeConfig(chunk_size=max(args.chunk_sizes)), args.checkpoint,
                                     dtype=args.dtype)
    engines = {}
    with tempfile.TemporaryDirectory(prefix="decoding-streams-") as scratch:
        calls = load_exported(export_translator(translator, Path(scratch) / "calls"))
        for batch in args.chunk_sizes:
            for streams in args.streams:
                engines[f"batch {batch}: {streams} concurrent call{'s' * (streams > 1)}"] = concurrent_calls(
                    calls.translate_with_lengths, batch, streams)
            for streams in args.streams:
                path = export_translator(translator.with_config(chunk_size=batch, streams=streams),
                                         Path(scratch) / f"b{batch}-s{streams}")
                label = f"batch {batch}: export, {streams} stream{'s' * (streams > 1)}"
                engines[label] = load_exported(path).translate_with_lengths
        started = time.perf_counter()
        report = compare_engines(engines, sources, repeats=args.repeats)
    report.update(_provenance(args, argv, tf, started))
    report.update({"dtype": args.dtype, "table": comparison_table(report)})
    output = Path(args.output) if args.output else Path(args.run) / "decoding_streams.json"
    save_report(report, output)
    print(report["table"])
    print(f"report: {output}")
    return 0


def _cold_start(load, first_batch) -> tuple:
    """(the loaded engine's translate_with_lengths, {"load_s", "first_batch_s", "total_s", "second_batch_s"}):
    seconds to load it and to translate `first_batch` (one chunk) right after, the wait of a fresh
    process; then the same chunk again (warm): first − second is the one-time cost of the first call."""
    started = time.perf_counter()
    engine = load()
    loaded = time.perf_counter()
    engine.translate_with_lengths(list(first_batch))
    done = time.perf_counter()
    engine.translate_with_lengths(list(first_batch))
    again = time.perf_counter() - done
    return engine.translate_with_lengths, {"load_s": round(loaded - started, 3), "first_batch_s": round(done - loaded, 3),
                                           "total_s": round(done - started, 3), "second_batch_s": round(again, 3)}


def _compare(args, argv) -> int:
    """--compare ctranslate2: ours vs CTranslate2 on the same weights, interleaved."""
    import dataclasses
    import tempfile

    import tensorflow as tf

    from transformer.data.corpora import load_split
    from transformer.inference.ctranslate2_export import CTranslate2Translator, export_ctranslate2, import_ctranslate2
    from transformer.inference.evaluation import compare_engines, comparison_table, save_report
    from transformer.inference.export import export_translator, load_exported
    from transformer.inference.rundir import TOKENIZER_DIR, cast_model, translator_from_run
    from transformer.inference.translator import Translator

    ctranslate2 = import_ctranslate2()
    sources, references = load_split(data_dir=args.data, split=args.split, limit=args.limit)
    config = DecodeConfig(chunk_size=args.chunk_size, jit_compile=args.xla)
    translator = translator_from_run(args.run, config, args.checkpoint)
    engines, described, cold_start = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="decoding-comparison-") as scratch:
        for name, streams in [(name, streams) for name in args.ours for streams in args.streams]:
            if name == "in-memory":  # the Translator as configured, once
                if streams != args.streams[0]:
                    continue
                engines["ours in-memory"] = translator.translate_with_lengths
                described["ours in-memory"] = config.to_dict()
                continue
            xla = name.endswith("-xla") or (args.xla and not name.endswith("-no-xla"))
            beam = 4 if name.endswith("beam4") else 1
            variant = translator.with_config(jit_compile=xla, beam_size=beam, streams=streams)
            if "bf16" in name:
                variant = Translator(translator.tokenizers, cast_model(translator.model, "bfloat16"), variant.config)
            path = export_translator(variant, Path(scratch) / f"{name}-{streams}")
            label = (f"ours SavedModel{' bfloat16' if 'bf16' in name else ''}{' beam 4' if beam > 1 else ''}"
                     f"{' (XLA)' if xla else ''}{f', {streams} streams' if args.streams != [DecodeConfig().streams] else ''}")
            engines[label], cold_start[label] = _cold_start(lambda: load_exported(path), sources[:args.chunk_size])
            described[label] = variant.config.to_dict()
        for directory in args.exports:
            label = f"SavedModel {directory}"
            engines[label], cold_start[label] = _cold_start(lambda: load_exported(directory), sources[:args.chunk_size])
            described[label] = engines[label].__self__.manifest.get("decode", {})
        ct2_path = export_ctranslate2(translator.model, Path(args.run) / TOKENIZER_DIR, Path(scratch) / "ct2",
                                      config=config)
        for compute_type, inter, beam in [(c, i, b) for c in args.ct2_compute_types for i in args.ct2_inter_threads
                                          for b in args.ct2_beam_sizes]:
            intra = max(1, args.threads // inter)
            label = (f"CTranslate2 {compute_type}{f' beam {beam}' if beam > 1 else ''}"
                     + (f", {inter} × {intra} threads" if inter > 1 else ""))
            ct2_config = dataclasses.replace(config, beam_size=beam)
            engines[label], cold_start[label] = _cold_start(
                lambda: CTranslate2Translator(ct2_path, compute_type=compute_type, intra_threads=intra,
                                              inter_threads=inter, batch_size=args.chunk_size,
                                              tokenizers=translator.tokenizers, config=ct2_config),
                sources[:args.chunk_size])
            described[label] = {"compute_type": compute_type, "inter_threads": inter, "intra_threads": intra,
                                "max_batch_size": args.chunk_size, **dataclasses.asdict(ct2_config)}
        started = time.perf_counter()
        report = compare_engines(engines, sources, repeats=args.repeats, references=references)
    for name, description in described.items():
        report["engines"][name]["settings"] = description
        if name in cold_start:  # engines loaded here (not the in-memory Translator)
            report["engines"][name]["cold_start"] = cold_start[name]
    report.update(_provenance(args, argv, tf, started))
    report.update({"ctranslate2": ctranslate2.__version__, "table": comparison_table(report)})
    output = Path(args.output) if args.output else Path(args.run) / "decoding_comparison.json"
    save_report(report, output)
    print(report["table"])
    machine = report["machine"]
    identity = ", ".join(filter(None, [machine.get("cpu_id"), ", ".join(machine["bf16_instructions"])
                                       or "no BF16 instructions"]))
    print(f"{machine['cpu']} ({identity}), "
          f"TensorFlow's oneDNN ops {ONEDNN_STATE[report['onednn']['enabled']]}, load average {machine['load_average']}")
    print(f"report: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
