"""Figures that must hold on a GPU too: float32 matmuls stay float32 in tests (no TF32), and
the utilisation peak probe saturates the device it measures (shape chosen per device, its
device taken from where the model lives). GPU sizes are checked without a GPU: the timer is
replaced by one that records what it was asked for."""

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from transformer.runtime import flops
from transformer.runtime.flops import CPU_PROBE_SIZE, GPU_PROBE_SIZE, measure_peak_flops, peak_probe_shape
from transformer.training.timing import BatchTimer


def test_tf32_is_off_during_tests():
    assert tf.config.experimental.tensor_float_32_execution_enabled() is False
    assert os.environ["NVIDIA_TF32_OVERRIDE"] == "0"  # child processes (scripts, workers) too


@pytest.mark.parametrize("device, dtype, shape", [
    ("/GPU:0", "mixed_bfloat16", (GPU_PROBE_SIZE, "bfloat16")),
    ("/job:localhost/replica:0/task:0/device:GPU:0", "mixed_float16", (GPU_PROBE_SIZE, "float16")),
    ("/gpu:1", "float32", (GPU_PROBE_SIZE, "float32")),
    ("/CPU:0", "mixed_bfloat16", (CPU_PROBE_SIZE, "bfloat16")),
    ("/job:localhost/replica:0/task:0/device:CPU:0", "float32", (CPU_PROBE_SIZE, "float32")),
])
def test_peak_probe_shape_follows_device_and_policy(device, dtype, shape):
    assert peak_probe_shape(device, dtype) == shape
    assert GPU_PROBE_SIZE >= 8192 and CPU_PROBE_SIZE <= 1024  # an H100 needs 8192²; a CPU probe stays ~1 s


def test_peak_probe_uses_that_shape(monkeypatch):
    asked = []

    def fake_timer(dtype, device, size):
        asked.append((dtype, device, size))
        return lambda iters: 1e-3 * iters  # 1 ms per matmul

    monkeypatch.setattr(flops, "matmul_chain_timer", fake_timer)
    peak = measure_peak_flops("mixed_bfloat16", "/GPU:0", seconds=0.01)
    assert asked == [("mixed_bfloat16", "/GPU:0", GPU_PROBE_SIZE)]
    assert peak == pytest.approx(2.0 * GPU_PROBE_SIZE**3 / 1e-3)
    measure_peak_flops("float32", "/CPU:0", seconds=0.01)
    assert asked[-1] == ("float32", "/CPU:0", CPU_PROBE_SIZE)


def test_default_device_ignores_hidden_gpus(monkeypatch):
    """--device cpu hides the GPUs; the probe must not then pick a GPU size for the CPU."""
    gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [gpu] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [])
    assert flops.default_device() == "/CPU:0"
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: [gpu])
    assert flops.default_device() == "/GPU:0"


def test_batch_timer_probes_the_model_device_in_its_compute_dtype(monkeypatch):
    from transformer.training import timing

    asked = []

    def fake_peak(dtype, device=None, **kwargs):
        asked.append((dtype, device))
        return 1e12

    monkeypatch.setattr(timing, "measure_peak_flops", fake_peak)
    try:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        timer = BatchTimer(probe_peak=True, measure_input_wait=False, write_every_s=None)
        model.fit(np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"), batch_size=4, epochs=1,
                  verbose=0, callbacks=[timer])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    (dtype, device), = asked
    assert dtype == "bfloat16" and device == model.weights[0].value.device  # the CPU here, the GPU on a GPU machine
    assert device.endswith("GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0")
    assert timer.report.peak_flops == 1e12 and math.isfinite(timer.summary()["peak_flops"])
