"""`select_device` runs again in one process: for the same device, another one, after TensorFlow
initialised its devices.

A GPU is simulated by `FakeDevices`, which replaces the `tf.config` calls `select_device`
makes and follows TensorFlow's rules for them (tensorflow/python/eager/context.py): an
unchanged setting is a no-op, a change after initialisation raises RuntimeError. Two
real training runs check the same on this machine's CPU.
"""

import json
import logging

import keras
import pytest
import tensorflow as tf
from conftest import skip_where_a_gpu_is_visible

from transformer.runtime import devices, distribute
from transformer.runtime.devices import DeviceError, select_device


class FakeDevices:
    """One CPU and `gpus` GPUs with TensorFlow's configuration rules; `initialised` = an op ran."""

    def __init__(self, gpus: int = 1, initialised: bool = False):
        self.cpu = tf.config.PhysicalDevice("/physical_device:CPU:0", "CPU")
        self.gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(gpus)]
        self.visible = [self.cpu, *self.gpus]
        self.growth = {gpu: None for gpu in self.gpus}
        self.initialised = initialised

    def list_physical_devices(self, device_type=None):
        return [d for d in [self.cpu, *self.gpus] if device_type in (None, d.device_type)]

    def get_visible_devices(self, device_type=None):
        return [d for d in self.visible if device_type in (None, d.device_type)]

    def set_visible_devices(self, devices_, device_type=None):
        visible = [d for d in self.visible if d.device_type != device_type] + list(devices_)
        if visible == self.visible:
            return
        if self.initialised:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = visible

    def get_memory_growth(self, gpu):
        return self.growth[gpu]

    def set_memory_growth(self, gpu, enable):
        if self.growth[gpu] == enable:
            return
        if self.initialised:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[gpu] = enable


@pytest.fixture
def fake_gpu(monkeypatch):
    """Factory: `fake_gpu(initialised=False)` patches tf.config with a FakeDevices and returns it."""

    def make(gpus: int = 1, initialised: bool = False) -> FakeDevices:
        fake = FakeDevices(gpus, initialised)
        for name in ("list_physical_devices", "get_visible_devices", "set_visible_devices"):
            monkeypatch.setattr(tf.config, name, getattr(fake, name))
        for name in ("get_memory_growth", "set_memory_growth"):
            monkeypatch.setattr(tf.config.experimental, name, getattr(fake, name))
        monkeypatch.setattr(devices, "_warned", set())
        return fake

    return make


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == devices.__name__ and r.levelno >= logging.WARNING]


def test_gpu_twice_enables_memory_growth_once(fake_gpu, caplog):
    fake = fake_gpu()
    assert select_device("gpu") == "gpu" and fake.growth == {fake.gpus[0]: True}
    fake.initialised = True  # the first run's ops
    assert select_device("gpu") == "gpu" and select_device("auto") == "gpu"
    assert warnings_of(caplog) == []


def test_memory_growth_after_initialisation_warns_once_and_runs(fake_gpu, caplog):
    fake = fake_gpu(gpus=2, initialised=True)  # e.g. tokenizers built before train()
    assert select_device("auto") == "gpu" and select_device("gpu") == "gpu"
    assert fake.growth == {gpu: None for gpu in fake.gpus}
    (warning,) = warnings_of(caplog)
    assert "memory growth not enabled" in warning and "TF_FORCE_GPU_ALLOW_GROWTH" in warning


def test_cpu_before_initialisation_hides_the_gpus(fake_gpu, caplog):
    fake = fake_gpu()
    assert select_device("cpu") == "cpu" and fake.get_visible_devices("GPU") == []
    fake.initialised = True
    assert select_device("cpu") == "cpu"
    assert select_device("auto") == "cpu"  # auto uses what TensorFlow sees: the GPUs stay hidden
    assert isinstance(distribute.make_strategy(distribute.DEFAULT, "cpu"), type(tf.distribute.get_strategy()))
    assert warnings_of(caplog) == []


def test_cpu_after_the_gpu_initialised_is_placed_on_the_cpu(fake_gpu, caplog):
    fake = fake_gpu()
    assert select_device("gpu") == "gpu"
    fake.initialised = True
    assert select_device("cpu") == "cpu"
    assert fake.get_visible_devices("GPU") == fake.gpus  # TensorFlow cannot hide it any more
    (warning,) = warnings_of(caplog)
    assert warning.startswith("--device cpu: TensorFlow already initialised the GPU")
    assert "cannot hide it" in warning and "OneDeviceStrategy('/cpu:0')" in warning and "restart" in warning
    strategy = distribute.make_strategy(distribute.DEFAULT, "cpu")
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert strategy.extended.worker_devices[0].endswith("CPU:0")
    assert distribute.make_strategy(distribute.DEFAULT, "gpu") is tf.distribute.get_strategy()


def test_gpu_after_cpu_shows_the_gpus_again_or_says_to_restart(fake_gpu):
    fake = fake_gpu()
    assert select_device("cpu") == "cpu"
    assert select_device("gpu") == "gpu"  # nothing initialised yet: shown again
    assert fake.get_visible_devices("GPU") == fake.gpus and fake.growth[fake.gpus[0]] is True
    assert select_device("cpu") == "cpu"
    fake.initialised = True
    with pytest.raises(DeviceError, match=r"^--device gpu: the GPUs were hidden earlier.*restart the process"):
        select_device("gpu")


def test_no_gpu_and_bad_values():
    skip_where_a_gpu_is_visible()
    with pytest.raises(DeviceError, match="sees no GPU"):
        select_device("gpu")
    assert select_device("auto") == select_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="--device must be"):
        select_device("tpu")


def test_two_trainings_with_different_precisions_in_one_process(bible_tokenizers, tmp_path):
    from conftest import run_config

    from transformer.training.trainer import train

    policies = []
    try:
        for precision in ("off", "bfloat16"):
            output = tmp_path / precision
            config = run_config(bible_tokenizers, output, validation=False, epochs=1, steps_per_epoch=2,
                                mixed_precision=precision, device="cpu")
            result = train(config)
            report = json.loads((output / "report.json").read_text())
            assert report["state"] == "completed" and report["steps_done"] == 2
            policies.append(result.model.dtype_policy.name)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert policies == ["float32", "mixed_bfloat16"]


def test_training_on_cpu_while_a_gpu_stays_visible(bible_tokenizers, tmp_path, monkeypatch, caplog):
    """--device cpu after the GPU initialised: the run is placed on the CPU and its steps are counted."""
    from conftest import run_config

    from transformer.training.trainer import train

    fake = FakeDevices(initialised=True)
    monkeypatch.setattr(tf.config, "get_visible_devices", fake.get_visible_devices)
    monkeypatch.setattr(tf.config, "set_visible_devices", fake.set_visible_devices)
    output = tmp_path / "run"
    config = run_config(bible_tokenizers, output, validation=False, epochs=1, steps_per_epoch=2, device="cpu")
    result = train(config)
    report = json.loads((output / "report.json").read_text())
    assert report["run"]["distribution"]["class"] == "OneDeviceStrategy"
    assert report["state"] == "completed" and report["steps_done"] == 2
    assert report["tokens_seen"]["tgt_tokens"] > 0  # BatchTimer reads the batches under this strategy
    assert "CPU:0" in result.model.trainable_variables[0].value.device
    assert any("cannot hide it" in message for message in warnings_of(caplog))
