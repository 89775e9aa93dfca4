"""Shared fixtures: the shared Bible corpus, small real tokenizers built once per session,
and tiny model configs.

The corpus is read in place from `../shared/data/bible-pt-en` (never copied into the repo);
tests that need it are skipped, with the path in the reason, when it is absent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported
# "--mixed-precision auto" resolves to float32 in tests, whatever the CPU (AMX Xeon, EPYC with
# avx512_bf16, or none): runs stay identical across CI machines. tests/runtime/test_precision.py unpins it.
os.environ.setdefault("TRANSFORMER_AUTO_PRECISION", "off")
# Float32 matmuls in float32 on GPUs too: TF32 (on by default on Ampere and later) rounds their
# inputs to 10 mantissa bits, ~1e-4 off the values tests compare. The variable covers child
# processes (scripts, distributed workers); the call below this process.
os.environ.setdefault("NVIDIA_TF32_OVERRIDE", "0")
# README runs the tests in two processes (`-n 2`): on a GPU each takes memory as it needs it
# instead of all of it at start, so both fit on one device.
os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from helpers_model import TINY_MODEL  # noqa: E402
from helpers_translation import TOKENIZER_PAIRS, TOKENIZER_VOCAB, VAL_PAIRS, bible_slice_config, shared_tokenizers  # noqa: E402, F401

from transformer.base.config import DataConfig, ModelConfig, PipelineConfig, RunConfig, TokenizerConfig, TrainConfig  # noqa: E402
from transformer.base.constants import SHARED_CORPUS_DIR  # noqa: E402
from transformer.measure.reports import StepTimeReport  # noqa: E402
from transformer.measure.step_stats import StepRecord  # noqa: E402

tf.config.experimental.enable_tensor_float_32_execution(False)

REPO_ROOT = Path(__file__).resolve().parents[1]


def skip_where_a_gpu_is_visible() -> None:
    """Skips a test of the no-GPU behaviour (e.g. `--device gpu` refused) on a machine with a GPU."""
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
BIBLE_DIR = SHARED_CORPUS_DIR



@pytest.fixture
def bfloat16_policy():
    """Keras' global policy `mixed_bfloat16` for one test, float32 again after it."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="session")
def bible_dir() -> Path:
    """The shared corpus directory; skips the test when it is absent."""
    if not (BIBLE_DIR / "train.pt").is_file() or not (BIBLE_DIR / "train.en").is_file():
        pytest.skip(f"shared Bible corpus not found at {BIBLE_DIR} (needs train.pt / train.en)")
    return BIBLE_DIR


@pytest.fixture(scope="session")
def bible_data_config(bible_dir) -> DataConfig:
    """The slice of the Bible corpus the session tokenizers were learned from."""
    return bible_slice_config()


@dataclass
class BuiltTokenizers:
    tokenizers: object  # the restored PairTokenizers SavedModel (.src / .tgt)
    directory: Path
    config: TokenizerConfig
    corpus: object  # transformer.data.corpora.ParallelCorpus they were learned from
    data_config: DataConfig


@pytest.fixture(scope="session")
def bible_tokenizers(bible_data_config) -> BuiltTokenizers:
    """WordPiece tokenizers (vocab ~1000, lower-cased) learned once per test process from the
    first 1500 Bible pairs (`helpers_translation.shared_tokenizers`, which tiny translators share)."""
    tokenizers, directory, config, corpus = shared_tokenizers()
    return BuiltTokenizers(tokenizers, Path(directory), config, corpus, bible_data_config)




@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """(translator, path): one tiny random translator (`tiny_translator(DecodeConfig(chunk_size=4))`)
    and its SavedModel export, made once per test process and shared by the export, stepping and
    Unicode tests (an export costs ~6 s of CPU). Read-only: a test that writes exports its own."""
    from helpers_translation import tiny_translator

    from transformer.inference.export import export_translator
    from transformer.inference.translator import DecodeConfig

    translator = tiny_translator(DecodeConfig(chunk_size=4))
    return translator, export_translator(translator, tmp_path_factory.mktemp("tiny-export") / "translator")


@pytest.fixture
def tiny_model_config():
    """Factory: `tiny_model_config(**overrides)` → a tiny ModelConfig (2 layers, d_model 16)."""

    def make(**overrides) -> ModelConfig:
        config = dataclasses.replace(TINY_MODEL, **overrides)
        config.validate()
        return config

    return make


def script_main(name: str):
    """`main(argv) -> int` of scripts/<name>.py, loaded in-process (no subprocess, no new TF import).

    Works whether the script defines `main` or is a thin caller importing it from the package.
    """
    path = REPO_ROOT / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


TINY_RUN_STEPS = 3  # checkpoints at step 2 (--checkpoint-every-steps 2) and 3 (epoch end): two to average


@pytest.fixture(scope="session")
def tiny_run(bible_tokenizers, tmp_path_factory) -> Path:
    """A run directory trained by `scripts/train.py`'s main on the session tokenizers' corpus slice:
    1 layer, d_model 16, TINY_RUN_STEPS steps, float32, checkpoints at steps 2 and 3. Read-only:
    tests that write into a run directory copy it first."""
    run = tmp_path_factory.mktemp("tiny-run") / "run"
    assert script_main("train")(tiny_train_argv(bible_tokenizers, run, "--checkpoint-every-steps", "2")) == 0
    return run


def bible_slice_argv(bible_tokenizers) -> list[str]:
    """Data and tokenizer flags of the session tokenizers' corpus slice (any command that takes them
    reuses those tokenizers). The training files are named explicitly: the same tokenizer key, no
    validation split to compile."""
    data = bible_tokenizers.data_config
    return ["--train-src", f"{data.data_dir}/train.pt", "--train-tgt", f"{data.data_dir}/train.en",
            "--max-train-examples", str(data.max_train_examples),
            "--max-val-examples", str(data.max_val_examples), "--vocab-size", str(bible_tokenizers.config.vocab_size),
            "--lower-case", "--tokenizers-root", bible_tokenizers.config.root]


def tiny_train_argv(bible_tokenizers, output, *extra: str, steps: int = TINY_RUN_STEPS) -> list[str]:
    """`scripts/train.py` flags of a tiny run (1 layer, d_model 16, one epoch of `steps` steps, float32) on the
    session tokenizers' corpus slice, into `output`, then `extra`."""
    return [*bible_slice_argv(bible_tokenizers),
            "--num-layers", "1", "--d-model", "16", "--num-heads", "2", "--dff", "32", "--max-length", "24",
            "--max-tokens", "512", "--epochs", "1", "--steps-per-epoch", str(steps),
            "--bleu-sentences", "0", "--device", "cpu", "--mixed-precision", "off",
            "--no-probe-peak", "--verbose", "0", "--output", str(output), *extra]


# ---------------------------------------------------------------------------- shared helpers


def run_config(bible_tokenizers, output_dir, validation=True, **train) -> RunConfig:
    """A tiny, fast run on the session's Bible slice, reusing the session tokenizers.

    validation=False names the same training files explicitly (same data, so the same
    tokenizer key) without a validation split, which saves compiling the evaluation step.
    """
    data = bible_tokenizers.data_config
    if not validation:
        root = data.data_dir
        data = dataclasses.replace(data, data_dir=None, train_src=f"{root}/train.pt", train_tgt=f"{root}/train.en")
    return RunConfig(
        data=data,
        tokenizer=bible_tokenizers.config,
        model=ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, dropout_rate=0.1, max_length=32),
        pipeline=PipelineConfig(max_tokens=512),
        train=TrainConfig(**{"epochs": 2, "steps_per_epoch": 3, "probe_peak": False, "verbose": 0,
                             "mixed_precision": "off", "xla": False,
                             "lr_schedule": "inverse-sqrt", "warmup_steps": 10, "output_dir": str(output_dir),
                             **train}),
    )


@contextlib.contextmanager
def tokenizers_reused(bible_tokenizers):
    """Asserts that the block built no new tokenizer directory (the session's was reused)."""
    root = bible_tokenizers.directory.parent
    before = set(root.iterdir())
    yield
    assert set(root.iterdir()) == before


def write_report(path: Path, label: str, step_s: float, wait_s: float, steps: int = 6, bleus=()) -> Path:
    run = {"label": label, "precision": "float32", "xla": False, "pipeline": "naive", "batching": "64"}
    report = StepTimeReport(path, run=run, steps_planned=steps, environment={"device": "CPU"})
    report.evaluations.extend({"step": i, "bleu": bleu} for i, bleu in enumerate(bleus))
    with report.guard():
        for step in range(steps):
            time_s = 2.0 if step == 0 else step_s  # first step: trace/compile
            report.add_step(
                StepRecord(
                    step=step,
                    epoch=0,
                    batches=1,
                    time_s=time_s,
                    data_wait_s=wait_s,
                    examples=64,
                    src_tokens=900,
                    src_padded=1200,
                    tgt_tokens=1000,
                    tgt_padded=1300,
                )
            )
        report.train_wall_s = 2.0 + (steps - 1) * step_s
    return path
