"""XLA that compiles a few programs, once: the length grid, fixed evaluation rows, the
compilations counted in report.json, XLA's persistent cache, and `--xla auto` on a GPU.

XLA compiles one program per input shape of a compiled step. The pipeline's length grid
bounds the shapes (training drops remainders; with a grid meant for XLA, evaluation batches
are padded to full rows with all-pad rows that the masked loss ignores). One whole epoch
with `--xla on` runs in a fresh process, where XLA's own persistent cache counts what was
compiled (one file per program) and shows a second identical run loading, not compiling.
"""

import collections
import json
import os
import subprocess

import pytest
from conftest import run_config

from transformer.base import cli
from transformer.base.config import ModelConfig, PipelineConfig, RunConfig, TrainConfig
from transformer.base.constants import PAD_ID
from transformer.base.errors import ConfigError
from transformer.data.pipeline import geometric_lengths, length_grid, make_batches, padded_lengths, resolve_length_buckets
from transformer.inference.rundir import build_model
from transformer.model.optimizer import compile_model
from transformer.runtime.precision import (
    GPU_XLA_COMPILE_S,
    GPU_XLA_SPEEDUP,
    GPU_XLA_WARMUP_ROUND_S,
    MIN_XLA_GAIN,
    DeviceFacts,
    XlaWorkload,
    decide_precision,
)
from transformer.runtime.xla_cache import enable_xla_cache, prune_xla_cache, xla_cache_dir, xla_cache_entries
from transformer.training.trainer import _decide_xla, _with_decision
from transformer.training.training_data import count_batches, xla_workload

MAX_LENGTH = 32
GRID = [16, 24, 32]  # geometric_lengths(32)
MAX_TOKENS = 256
# The whole-epoch runs: two grid lengths are enough to show one program per length, and each
# program costs seconds of CPU to compile.
EPOCH_MAX_LENGTH = 24
EPOCH_GRID = [16, 24]  # geometric_lengths(24)
# XLA's CPU backend without LLVM's optimisation passes: what and how often XLA compiles, and its
# persistent cache, are unchanged; each compilation takes a fraction of the time.
FAST_CPU_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
H100 = DeviceFacts("gpu", "AMD EPYC", (), gpu_capability=(9, 0))


# ---------------------------------------------------------------------------- the grid


def test_geometric_grid_has_few_lengths_capped_at_max_length():
    assert geometric_lengths(128) == [16, 24, 32, 48, 64, 96, 128]
    assert geometric_lengths(200) == [16, 24, 32, 48, 64, 96, 128, 192, 200]
    assert geometric_lengths(MAX_LENGTH) == GRID and geometric_lengths(EPOCH_MAX_LENGTH) == EPOCH_GRID
    assert geometric_lengths(20) == [16, 20] and geometric_lengths(10) == [10]
    for max_length in range(1, 300):
        lengths = geometric_lengths(max_length)
        assert lengths == sorted(set(lengths)) and lengths[-1] == max_length
        assert all(b <= max(1.5 * a, 16) for a, b in zip([0, *lengths], lengths))  # each ≤ 1.5× the one before


def test_length_buckets_resolve_for_xla_and_explicit_lengths_are_capped():
    auto = PipelineConfig()
    assert auto.length_buckets == "auto" and length_grid(auto, 128) == padded_lengths(128, 4)  # 32 lengths
    assert resolve_length_buckets(auto, xla=True).length_buckets == "geometric"
    assert resolve_length_buckets(auto, xla=False).length_buckets == "width"
    explicit = PipelineConfig(length_buckets="16,32,64,256")
    assert resolve_length_buckets(explicit, xla=False) is explicit
    assert length_grid(explicit, 128) == [16, 32, 64, 128]
    assert length_grid(PipelineConfig(length_buckets="width", bucket_width=32), 100) == [32, 64, 96, 100]


def test_length_buckets_flag_config_and_errors():
    parser = cli.argparse.ArgumentParser()
    cli.add_pipeline_args(parser)
    cli.add_train_args(parser)
    config = cli.run_config_from_args(parser.parse_args(["--length-buckets", "geometric", "--xla-cache", "off",
                                                         "--no-xla-warmup"]))
    assert config.pipeline.length_buckets == "geometric" and config.train.xla_cache == "off"
    assert config.train.xla_warmup is False and RunConfig().train.xla_warmup is True
    assert RunConfig.from_dict(config.to_dict()) == config  # saved with the checkpoints
    assert RunConfig().pipeline.length_buckets == "auto" and RunConfig().train.xla_cache == "auto"
    for bad in ("16,8", "0,16", "fine", "16,,32"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--length-buckets", bad])
        with pytest.raises(ValueError, match="pipeline.length_buckets"):
            RunConfig().replace(pipeline={"length_buckets": bad}).validate()
    namespace = parser.parse_args([])
    namespace.length_buckets = "32,16"  # e.g. from a preset: the config error names the flag
    with pytest.raises(ConfigError, match=r"^pipeline.length_buckets must be .* \(flag --length-buckets\)"):
        cli.run_config_from_args(namespace)


def test_argparse_error_names_the_flag(capsys):
    parser = cli.argparse.ArgumentParser()
    cli.add_pipeline_args(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--length-buckets", "64,32"])
    assert "error: argument --length-buckets: must be increasing lengths" in capsys.readouterr().err


# ---------------------------------------------------------------------------- an epoch's batches


def batch_shapes(batches) -> list[tuple]:
    return [(src.shape, tgt_in.shape, tgt_out.shape) for (src, tgt_in), tgt_out in batches.as_numpy_iterator()]


def test_every_batch_of_an_epoch_has_a_shape_of_the_grid(bible_tokenizers):
    config = PipelineConfig(max_tokens=MAX_TOKENS, length_buckets="geometric")
    rows = {length: MAX_TOKENS // length for length in GRID}
    corpus, tokenizers = bible_tokenizers.corpus, bible_tokenizers.tokenizers
    train = batch_shapes(make_batches(corpus.train, tokenizers, config, MAX_LENGTH, training=True, seed=0))
    val = batch_shapes(make_batches(corpus.validation, tokenizers, config, MAX_LENGTH, training=False))
    for src, tgt_in, tgt_out in train + val:
        length = src[1]
        assert length in GRID and src == tgt_in == tgt_out == (rows[length], length)  # full rows, training and evaluation
        assert src[0] * src[1] <= MAX_TOKENS
    assert len(set(train)) == len(GRID)  # the whole epoch: every length used, no other shape
    assert set(val) <= set(train)
    # without XLA's grid evaluation batches keep their partial last batches: more shapes
    fine = batch_shapes(make_batches(corpus.validation, tokenizers, PipelineConfig(max_tokens=MAX_TOKENS), MAX_LENGTH,
                                     training=False))
    assert any(src[0] != MAX_TOKENS // src[1] for src, _, _ in fine)


def real_rows(batches) -> collections.Counter:
    """(src ids, tgt_out ids) without padding, for every row holding a target token; checks pad rows."""
    found = collections.Counter()
    for (src, tgt_in), tgt_out in batches.as_numpy_iterator():
        empty = (tgt_out == PAD_ID).all(axis=1)
        assert (src[empty] == PAD_ID).all() and (tgt_in[empty] == PAD_ID).all()  # pad rows are all pad
        assert not empty[: (~empty).sum()].any()  # appended after the real rows
        found.update((tuple(s[s != PAD_ID]), tuple(t[t != PAD_ID])) for s, t in zip(src[~empty], tgt_out[~empty]))
    return found


def test_padded_evaluation_rows_hold_every_pair_once(bible_tokenizers):
    corpus, tokenizers = bible_tokenizers.corpus, bible_tokenizers.tokenizers
    padded = make_batches(corpus.validation, tokenizers, PipelineConfig(max_tokens=MAX_TOKENS, length_buckets="geometric"),
                          MAX_LENGTH, training=False)
    unpadded = make_batches(corpus.validation, tokenizers, PipelineConfig(max_tokens=MAX_TOKENS), MAX_LENGTH,
                            training=False)
    assert real_rows(padded) == real_rows(unpadded)
    assert sum(real_rows(padded).values()) == corpus.num_validation


def test_padded_validation_rows_leave_loss_and_metrics_unchanged(bible_tokenizers, tiny_model_config):
    """Keras `evaluate` (fit's validation pass) on batches padded with all-pad rows = on the same batches unpadded."""
    tokenizers = bible_tokenizers.tokenizers
    model_config = tiny_model_config(num_layers=1, max_length=MAX_LENGTH,
                                     src_vocab_size=int(tokenizers.src.get_vocab_size()),
                                     tgt_vocab_size=int(tokenizers.tgt.get_vocab_size()))
    model = build_model(model_config)
    compile_model(model, RunConfig(model=model_config, train=TrainConfig(xla=False, lr_schedule="inverse-sqrt")))
    config = PipelineConfig(max_tokens=MAX_TOKENS, length_buckets="geometric")
    padded = list(make_batches(bible_tokenizers.corpus.validation, tokenizers, config, MAX_LENGTH,
                               training=False).as_numpy_iterator())
    unpadded = []
    for (src, tgt_in), tgt_out in padded:
        real = ~(tgt_out == PAD_ID).all(axis=1)
        unpadded.append(((src[real], tgt_in[real]), tgt_out[real]))
    assert any(len(u[1]) < len(p[1]) for u, p in zip(unpadded, padded))  # some batches were padded

    def evaluate(batches):
        logs = model.evaluate(iter_dataset(batches), verbose=0, return_dict=True)
        return logs["loss"], logs["masked_accuracy"]

    assert evaluate(padded) == pytest.approx(evaluate(unpadded), rel=1e-6)
    for ((src, tgt_in), tgt_out), ((usrc, utgt_in), utgt_out) in zip(padded, unpadded):  # and batch by batch
        loss = model.loss(tgt_out, model((src, tgt_in), training=False))
        assert float(loss) == pytest.approx(float(model.loss(utgt_out, model((usrc, utgt_in), training=False))),
                                            rel=1e-5)


def iter_dataset(batches):
    import tensorflow as tf

    return tf.data.Dataset.from_generator(
        lambda: iter(batches),
        output_signature=((tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)),
                          tf.TensorSpec([None, None], tf.int32)))


# ---------------------------------------------------------------------------- --xla auto on a GPU


def test_xla_auto_on_a_gpu_weighs_compilations_against_the_run():
    def decide(workload):
        return decide_precision("auto", None, "gpu", facts=H100, workload=workload)

    # compiled one after the other (--no-xla-warmup): 7 × 32 s
    short = decide(XlaWorkload(programs=7, budget_s=3 * 60))  # 7 × 32 s > 180 s
    assert short.xla is False and short.xla_reason.startswith("XLA off: 7 programs × ~32 s")
    assert "--xla on forces it" in short.xla_reason and "0.00× the tokens" in short.xla_reason
    five = decide(XlaWorkload(programs=7, budget_s=5 * 60))
    assert five.xla is False and "0.58× the tokens" in five.xla_reason
    # break-even: (T − 7 × 32 s) × 2.3 = 1.25 T  ⇔  T = 224 s / (1 − 1.25 / 2.3) = 491 s
    break_even = 7 * GPU_XLA_COMPILE_S / (1 - MIN_XLA_GAIN / GPU_XLA_SPEEDUP)
    assert break_even == pytest.approx(490.7, abs=0.1)
    assert decide(XlaWorkload(programs=7, budget_s=10 * 60)).xla is True
    assert decide(XlaWorkload(programs=7, budget_s=break_even * 1.01)).xla is True
    assert decide(XlaWorkload(programs=7, budget_s=break_even * 0.99)).xla is False
    assert decide(XlaWorkload(programs=14, budget_s=break_even * 1.01)).xla is False  # + evaluation programs
    assert decide(XlaWorkload(programs=7, budget_s=30 * 60)).xla is True
    # compiled all at once by the warm-up: a round of 8 programs in ~45 s (6 measured in 44.7 s on the H100's host)
    warm = XlaWorkload(programs=7, budget_s=3 * 60, compile_threads=8)
    assert warm.compile_s() == GPU_XLA_WARMUP_ROUND_S and decide(warm).xla is True  # README's 3-minute GPU run
    assert "7 programs compiled 8 at once" in decide(warm).xla_reason and "1.73× the tokens" in decide(warm).xla_reason
    warm_break_even = GPU_XLA_WARMUP_ROUND_S / (1 - MIN_XLA_GAIN / GPU_XLA_SPEEDUP)
    assert warm_break_even == pytest.approx(98.6, abs=0.1)
    assert decide(XlaWorkload(programs=7, budget_s=warm_break_even * 1.01, compile_threads=8)).xla is True
    assert decide(XlaWorkload(programs=7, budget_s=warm_break_even * 0.99, compile_threads=8)).xla is False
    assert XlaWorkload(programs=14, compile_threads=8).compile_s() == 2 * GPU_XLA_WARMUP_ROUND_S  # two rounds
    assert XlaWorkload(programs=7, compile_threads=2).compile_s() == 4 * GPU_XLA_WARMUP_ROUND_S  # a 2-core host
    steps = XlaWorkload(programs=7, steps=100_000)  # × 35.5 ms = 59 min of training
    assert steps.train_s() == pytest.approx(3550) and decide(steps).xla is True
    assert "100,000 steps × 36 ms" in decide(steps).xla_reason
    assert decide(XlaWorkload(programs=7, steps=1_000)).xla is False
    assert decide(XlaWorkload(programs=7, budget_s=60)).xla is False  # compiling outlasts the budget: no tokens
    assert XlaWorkload(programs=1, steps=1, tokens_per_batch=16384).train_s() == pytest.approx(0.0479)
    assert decide(XlaWorkload(programs=7)).xla is True  # run length unknown: assumed long
    assert decide(None).xla is True
    # explicit flags win; CPU and the naive pipeline stay off whatever the run
    assert decide_precision("auto", True, facts=H100, workload=XlaWorkload(programs=7, budget_s=60)).xla is True
    cpu = DeviceFacts("cpu", "Intel Xeon", ())
    assert decide_precision("auto", None, facts=cpu, workload=XlaWorkload(programs=1, budget_s=1e6)).xla is False
    assert decide_precision("auto", None, "gpu", "naive", facts=H100,
                            workload=XlaWorkload(programs=1, budget_s=1e6)).xla is False


def test_xla_workload_counts_the_programs_a_run_compiles():
    model = ModelConfig(max_length=128)
    budgeted = RunConfig(model=model, train=TrainConfig(time_budget_minutes=30))
    assert xla_workload(budgeted, None, validation=True) == XlaWorkload(programs=7, budget_s=1800, tokens_per_batch=2048)
    no_bleu = budgeted.replace(train={"bleu_sentences": 0})  # fit validates every epoch: evaluation programs too
    assert xla_workload(no_bleu, None, validation=True).programs == 14
    epochs = RunConfig(model=model, train=TrainConfig(epochs=20))
    assert xla_workload(epochs, None, validation=False) == XlaWorkload(programs=7)
    assert xla_workload(epochs, 600, validation=True) == XlaWorkload(programs=14, steps=12_000)
    given = epochs.replace(train={"steps_per_epoch": 50}, pipeline={"max_tokens": 4096})
    assert xla_workload(given, None, validation=False) == XlaWorkload(programs=7, steps=1_000, tokens_per_batch=4096)
    assert xla_workload(budgeted, None, True, compile_threads=8).compile_threads == 8  # the warm-up's
    no_warmup = budgeted.replace(train={"xla_warmup": False})
    assert xla_workload(no_warmup, None, True, compile_threads=8).compile_threads == 1


# ---------------------------------------------------------------------------- the persistent cache


def test_xla_cache_directory_and_flags(monkeypatch, tmp_path):
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TRANSFORMER_XLA_CACHE", raising=False)
    auto = xla_cache_dir("auto")
    assert auto.parent == tmp_path / "xdg" / "transformer-nmt" / "xla" and len(auto.name) == 16
    assert xla_cache_dir("auto") == auto  # the same machine key every time
    monkeypatch.setenv("TRANSFORMER_XLA_CACHE", str(tmp_path / "env"))
    assert xla_cache_dir("auto") == tmp_path / "env" and xla_cache_dir("off") is None
    monkeypatch.setenv("TRANSFORMER_XLA_CACHE", "off")
    assert xla_cache_dir("auto") is None
    assert xla_cache_dir(str(tmp_path / "given")) == tmp_path / "given"
    assert enable_xla_cache("off") is None and "TF_XLA_FLAGS" not in os.environ
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=0")
    entry = enable_xla_cache(str(tmp_path / "given"))
    assert entry == {"directory": str(tmp_path / "given"), "entries_before": 0, "pruned": 0}
    assert os.environ["TF_XLA_FLAGS"] == f"--tf_xla_auto_jit=0 --tf_xla_persistent_cache_directory={tmp_path / 'given'}"
    assert enable_xla_cache(str(tmp_path / "other"))["directory"] == str(tmp_path / "given")  # one already named wins


def test_xla_cache_key_tells_cpu_generations_of_one_name_apart(monkeypatch):
    """Cloud VMs call Zen 4 and Zen 5 both 'AMD EPYC': the key also holds family/model/stepping."""
    from transformer.runtime import xla_cache

    def cpuinfo(model: int) -> str:
        return (f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {model}\n"
                "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")

    keys = []
    for model in (17, 17, 1):
        monkeypatch.setattr(xla_cache, "cpuinfo_text", lambda model=model: cpuinfo(model))
        keys.append(xla_cache.machine_key())
    assert keys[0] == keys[1] != keys[2]
    monkeypatch.setattr(xla_cache, "cpuinfo_text", lambda: cpuinfo(17).replace(" avx512_bf16", ""))
    assert xla_cache.machine_key() not in keys  # the flags stay in it


def test_xla_cache_keeps_the_newest_programs_within_its_size(tmp_path):
    for age, name in enumerate(["new", "mid", "old"]):
        path = tmp_path / f"xla_compile_cache__{name}__XLA_CPU_JIT.pb"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1e9 - age, 1e9 - age))
    (tmp_path / "unrelated.txt").write_bytes(b"x" * 1000)
    assert prune_xla_cache(tmp_path, max_bytes=250) == 1
    assert sorted(p.name.split("__")[1] for p in tmp_path.glob("xla_compile_cache*")) == ["mid", "new"]
    assert prune_xla_cache(tmp_path, max_bytes=250) == 0 and (tmp_path / "unrelated.txt").exists()
    assert xla_cache_entries(tmp_path) == 2 and xla_cache_entries(tmp_path / "absent") == 0


# ---------------------------------------------------------------------------- a whole epoch with --xla on


def train_process(bible_tokenizers, output, cache, *extra: str) -> dict:
    """One epoch (training + validation) of a tiny model with --xla on in a fresh process; its report.
    The child compiles with `FAST_CPU_COMPILE` (XLA reads $XLA_FLAGS once, in the child: every run
    that shares the cache passes the same flags)."""
    data = bible_tokenizers.data_config
    args = ["--data", data.data_dir, "--max-train-examples", str(data.max_train_examples),
            "--max-val-examples", str(data.max_val_examples), "--vocab-size", str(bible_tokenizers.config.vocab_size),
            "--lower-case", "--tokenizers-root", bible_tokenizers.config.root,
            "--num-layers", "1", "--d-model", "16", "--num-heads", "2", "--dff", "32",
            "--max-length", str(EPOCH_MAX_LENGTH), "--max-tokens", str(MAX_TOKENS), "--epochs", "1",
            "--bleu-sentences", "0", "--device", "cpu", "--mixed-precision", "off", "--xla", "on",
            "--xla-cache", str(cache), "--no-probe-peak", "--verbose", "0", "--output", str(output), *extra]
    env = cli.subprocess_env()
    env.pop("TF_XLA_FLAGS", None)
    env["XLA_FLAGS"] = FAST_CPU_COMPILE
    done = subprocess.run(cli.command_line("train", *args), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((output / "report.json").read_text())


def test_an_epoch_with_xla_compiles_one_program_per_grid_length_once(bible_tokenizers, tmp_path):
    """With the warm-up (the default): every program compiled before the first step, from the trace
    the steps then use (tests/training/test_xla_warmup.py: the warm-up's steps leave no trace)."""
    cache = tmp_path / "xla-cache"
    first = train_process(bible_tokenizers, tmp_path / "first", cache)
    compiled = first["compile"]
    assert compiled["xla"] is True and compiled["length_grid"] == EPOCH_GRID  # auto → geometric with XLA
    assert compiled["xla_flags"] == FAST_CPU_COMPILE
    steps_done = first["steps_done"]
    programs = 0
    for step in ("train", "evaluate"):
        entry = compiled[step]
        assert entry["traces"] == 1  # one trace; XLA then compiles per shape
        assert 1 <= entry["compilations"] == len(entry["shapes"]) <= len(EPOCH_GRID)
        assert all(rows == MAX_TOKENS // length and length == tgt for rows, length, tgt in entry["shapes"])
        warmed = {tuple(shape) for shape in compiled["warmup"][step]["shapes"]}
        assert {(rows, length) for rows, length, _ in entry["shapes"]} <= warmed  # nothing left to the run
        assert compiled["warmup"][step]["failed"] == {}
        programs += len(warmed)
    assert len(compiled["train"]["shapes"]) == len(EPOCH_GRID) and steps_done > 3 * len(EPOCH_GRID)  # a whole epoch
    assert compiled["warmup"]["threads"] == 2 and compiled["warmup"]["seconds"] > 0
    # XLA's own count, one cache file per compiled program: the warm-up's programs are the ones the
    # steps used (a warm-up keyed under another trace would have left the run to compile its own)
    assert compiled["persistent_cache"] == {"directory": str(cache), "entries_before": 0, "pruned": 0,
                                            "entries_after": programs}
    # the same run again: every program loaded from the cache, none compiled (nothing new written).
    # (Keys hold the trace's name, which carries a process-wide counter: a run without the warm-up traces
    # at another point and keys its programs apart, so a cache serves runs with the same setting.)
    again = train_process(bible_tokenizers, tmp_path / "again", cache)["compile"]
    assert again["persistent_cache"] == {"directory": str(cache), "entries_before": programs, "pruned": 0,
                                         "entries_after": programs}
    assert again["train"]["shapes"] == compiled["train"]["shapes"]


def test_training_counts_the_epoch_to_decide_xla_on_a_gpu(bible_tokenizers, tmp_path):
    """No budget, no --steps-per-epoch: the epoch is counted on the XLA grid, then XLA and the grid decided."""
    corpus, tokenizers = bible_tokenizers.corpus, bible_tokenizers.tokenizers
    short = run_config(bible_tokenizers, tmp_path, epochs=1, steps_per_epoch=None, xla=None)
    tentative = decide_precision("off", None, facts=H100)  # before counting: the run length is not known
    assert tentative.xla is True and _with_decision(short, tentative).pipeline.length_buckets == "geometric"
    decision, config, steps = _decide_xla(short, tentative, _with_decision(short, tentative), corpus, tokenizers,
                                          "default", 1, None)
    assert decision.xla is False and "too short to repay" in decision.xla_reason
    assert config.train.xla is False and config.pipeline.length_buckets == "width" and steps is None  # recounted later
    long = short.replace(train={"epochs": 10_000})
    decision, config, steps = _decide_xla(long, tentative, _with_decision(long, tentative), corpus, tokenizers,
                                          "default", 1, None)
    assert decision.xla is True and decision.xla_reason.startswith("XLA on: 6 programs")  # 3 lengths, train + evaluate
    assert config.pipeline.length_buckets == "geometric"
    assert steps == count_batches(corpus, tokenizers, config) and f"{10_000 * steps:,} steps" in decision.xla_reason
    explicit = short.replace(train={"xla": True})
    assert _decide_xla(explicit, tentative, explicit, corpus, tokenizers, "default", 1, None) == (tentative, explicit, None)


def test_a_late_xla_decision_keeps_the_batch_training_resolved_before():
    """`--xla auto` on a GPU is decided after `--max-tokens auto`: turning XLA off re-resolves the
    grid but keeps the probed batch and its scaled schedule."""
    from types import SimpleNamespace

    requested = RunConfig()  # max_tokens "auto", length_buckets "auto"
    resolved = requested.replace(pipeline={"max_tokens": 16384, "length_buckets": "geometric"},
                                 train={"xla": True, "lr_batch_factor": 2.0})
    final = _with_decision(requested, SimpleNamespace(mixed_precision="bfloat16", xla=False), resolved)
    assert final.pipeline.max_tokens == 16384 and final.train.lr_batch_factor == 2.0
    assert final.pipeline.length_buckets == "width" and final.train.xla is False
    assert final.train.mixed_precision == "bfloat16"
    assert _with_decision(requested, SimpleNamespace(mixed_precision="off", xla=True)).pipeline.max_tokens == "auto"
