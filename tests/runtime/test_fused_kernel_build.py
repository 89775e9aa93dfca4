"""`--fused-kernels`: when the C++ kernels are built, used, cached, and why not (auto falls back, on fails)."""

from pathlib import Path

import pytest
import tensorflow as tf

from transformer.runtime import fused_kernels
from transformer.runtime.fused_kernels import (
    KernelsUnavailable,
    active_kernels,
    build_library,
    disable_fused_kernels,
    enable_fused_kernels,
)


@pytest.fixture(autouse=True)
def _disabled_after():
    yield
    disable_fused_kernels()


def test_off_builds_nothing(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    state = enable_fused_kernels("off", "cpu", xla=False)
    assert state["enabled"] is False and state["reason"] == "--fused-kernels off" and active_kernels() is None


@pytest.mark.parametrize("device,xla,reason", [("gpu", False, "trains on gpu"), ("cpu", True, "XLA")])
def test_auto_falls_back_where_they_cannot_run_and_on_says_why(device, xla, reason):
    state = enable_fused_kernels("auto", device, xla=xla)
    assert state["enabled"] is False and reason in state["reason"] and active_kernels() is None
    with pytest.raises(KernelsUnavailable, match=reason):
        enable_fused_kernels("on", device, xla=xla)


def test_without_a_compiler_auto_trains_with_tensorflow_ops(monkeypatch, tmp_path):
    monkeypatch.setattr(fused_kernels, "_loaded", None)  # a fresh process: no library loaded by an earlier test
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv(fused_kernels.CACHE_ENV, str(tmp_path / "cache"))
    state = enable_fused_kernels("auto", "cpu", xla=False)
    assert state["enabled"] is False and "no-such-compiler" in state["reason"] and active_kernels() is None
    with pytest.raises(KernelsUnavailable, match="no-such-compiler"):
        enable_fused_kernels("on", "cpu", xla=False)


def test_a_compiler_error_is_reported_not_raised_under_auto(monkeypatch, tmp_path):
    compiler = tmp_path / "broken-c++"
    compiler.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo broken 1.0; exit 0; }\n"
                        "echo 'fused_kernels.cc:1: error: this compiler is broken' >&2; exit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setattr(fused_kernels, "_loaded", None)  # a fresh process: no library loaded by an earlier test
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv(fused_kernels.CACHE_ENV, str(tmp_path / "cache"))
    state = enable_fused_kernels("auto", "cpu", xla=False)
    assert state["enabled"] is False and "this compiler is broken" in state["reason"]
    assert not list((tmp_path / "cache").rglob("*.so*"))  # no partial library left behind


def test_the_library_is_built_once_per_machine_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(fused_kernels.CACHE_ENV, str(tmp_path))
    try:
        library, build_s = build_library()
    except KernelsUnavailable as err:
        pytest.skip(f"fused kernels cannot be built here: {err}")
    assert library.is_file() and library.parent.parent == tmp_path and build_s > 0
    again, again_s = build_library()
    assert again == library and again_s == 0.0
    state = enable_fused_kernels("auto", "cpu", xla=False)  # loads the process's one library (maybe another cache's)
    assert state["enabled"] and Path(state["library"]).is_file() and active_kernels() is not None
    # A second library with the same ops would make every op ambiguous ("Multiple OpKernel registrations"):
    # the process keeps the first, whatever cache a later build used, and its ops run.
    monkeypatch.setenv(fused_kernels.CACHE_ENV, str(tmp_path / "another"))
    build_library()
    enable_fused_kernels("on", "cpu", xla=False)
    y, _, _ = active_kernels().fused_layer_norm(tf.ones([2, 3]), tf.ones([3]), tf.zeros([3]), epsilon=1e-6)
    assert y.shape == (2, 3)
