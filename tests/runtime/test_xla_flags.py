"""XLA's GPU compiler flags: added once, the user's own flags win, and this TensorFlow's XLA knows them."""

import os
import subprocess
import sys

from transformer.runtime.xla_flags import GPU_XLA_FLAGS, XLA_FLAGS_ENV, enable_fast_gpu_compile


def child_env() -> dict:
    """This environment without XLA's variables: an earlier test in the same worker may have named
    a persistent program cache in $TF_XLA_FLAGS (training does), and a cache hit compiles nothing."""
    return {k: v for k, v in os.environ.items() if k not in (XLA_FLAGS_ENV, "TF_XLA_FLAGS")}


def test_flags_are_added_once(monkeypatch):
    monkeypatch.delenv(XLA_FLAGS_ENV, raising=False)
    assert enable_fast_gpu_compile() == " ".join(GPU_XLA_FLAGS)
    assert enable_fast_gpu_compile() is None  # already there: nothing added
    assert os.environ[XLA_FLAGS_ENV].split() == list(GPU_XLA_FLAGS)


def test_a_flag_the_user_set_wins_and_others_are_kept(monkeypatch):
    monkeypatch.setenv(XLA_FLAGS_ENV, "--xla_dump_to=/tmp/x --xla_gpu_enable_triton_gemm=true")
    enable_fast_gpu_compile()
    flags = os.environ[XLA_FLAGS_ENV].split()
    assert flags == ["--xla_dump_to=/tmp/x", "--xla_gpu_enable_triton_gemm=true", "--xla_gpu_autotune_level=0"]


def test_an_unknown_flag_is_refused_by_xla():
    """The check above can fail: XLA does refuse a flag it does not know."""
    code = ("import tensorflow as tf\n"
            "f = tf.function(lambda x: x * 2.0, jit_compile=True)\n"
            "print('ok', float(f(tf.constant(1.0))))\n")
    env = {**child_env(), XLA_FLAGS_ENV: "--xla_gpu_no_such_flag_anywhere=true", "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "ok" not in done.stdout


def test_benchmark_xla_times_each_shape_with_and_without_xla(tmp_path):
    """scripts/benchmark_xla.py on a tiny model: one cell per (XLA, shape), one trace per model, compilations in the first step,
    training's flags recorded."""
    import json

    out = tmp_path / "xla.json"
    env = {**child_env(), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "scripts/benchmark_xla.py", "--vocab-size", "64", "--num-layers", "1",
                           "--tokens", "64", "--lengths", "16", "8", "--steps", "2", "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    cells = report["cells"]
    assert [(c["xla"], c["rows"], c["length"]) for c in cells] == [("off", 4, 16), ("off", 8, 8),
                                                                   ("on", 4, 16), ("on", 8, 8)]
    assert report["xla_flags"] == " ".join(GPU_XLA_FLAGS) and report["policy"] == "float32"
    for cell in cells:
        assert cell["trace_s"] > cell["median_step_s"] > 0  # training's one trace, before the first step
        if cell["xla"] == "on":
            assert cell["first_step_s"] > cell["median_step_s"]  # compiling this shape comes first
        assert cell["tgt_tokens_per_s"] == cell["rows"] * cell["length"] / cell["median_step_s"]
    assert len({(c["xla"], c["trace_s"]) for c in cells}) == 2  # one trace per model for both shapes
    assert "| on | [8, 8] |" in done.stdout


def test_xla_accepts_the_flags_set_after_tensorflow_started(tmp_path):
    """XLA aborts the process on a flag it does not know (a renamed flag would stop every GPU run), and
    train() sets the flags after TensorFlow started (scripts import it first): XLA must read them at its
    first compilation. A dump directory named only then fills."""
    dump = tmp_path / "dump"
    flags = " ".join([*GPU_XLA_FLAGS, f"--xla_dump_to={dump}"])
    code = ("import os, tensorflow as tf\n"
            "x = tf.constant([1.0, 2.0]) * 2.0\n"
            "tf.config.list_physical_devices()\n"
            f"os.environ['XLA_FLAGS'] = {flags!r}\n"
            "print(tf.function(lambda v: tf.nn.relu(v) * 3.0, jit_compile=True)(x).numpy())\n")
    env = {**child_env(), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "[ 6. 12.]" in done.stdout and dump.is_dir() and any(dump.iterdir())
