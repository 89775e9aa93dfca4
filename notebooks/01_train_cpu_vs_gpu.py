# ---
# jupyter:
#   colab:
#     provenance: []
#     toc_visible: true
#   jupytext:
#     notebook_metadata_filter: colab,accelerator,kernelspec,language_info
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
#   language_info:
#     name: python
# ---

# %% [markdown]
# # Training speed: CPU vs GPU, precision, XLA and the input pipeline
#
# This notebook trains the pt→en Transformer for a few steps under different settings and
# compares their **step-time reports**: each `transformer.training.trainer.train()` run writes
# `report.json` (environment, settings, steady-state step time, tokens/s, time spent
# waiting for data) plus a per-step CSV, and `transformer.measure.compare` turns two or more
# reports into a table and a plot.
#
# 1. **Setup**: clone + pinned install on Colab; nothing to install locally.
# 2. **Device diagnostics**: what TensorFlow sees, `nvidia-smi`, versions, which
#    precisions this hardware runs fast.
# 3. **Short trainings**: one per entry of `RUNS` (pipeline × precision × XLA), same data,
#    model and number of steps.
# 4. **Comparison**: table + step-time plot, speed-ups relative to the first report.
#
# Pick the runtime first (**Runtime → Change runtime type**: CPU or T4 GPU). Comparing CPU
# with GPU takes one run of this notebook per runtime type; see the last section.
# All size knobs are in the next cell.

# %% tags=["parameters"]
# Colab only: where the code comes from (replace with this repository's public URL).
REPO_URL = "https://github.com/<org>/<repo>.git"
REPO_REF = "main"                 # branch or tag to clone
COLAB_REPO_DIR = "/content/nmt"   # where the clone goes on Colab

# Data. "auto": the TFDS TED talks corpus on Colab (downloaded there); elsewhere the
# offline Bible corpus at <repo>/../shared/data/bible-pt-en when present, else TFDS.
# Or a directory with train.pt/train.en/validation.pt/validation.en, or None for TFDS.
DATA_DIR = "auto"
DATASET = "ted_hrlr_translate/pt_to_en"   # the TFDS dataset used when DATA_DIR is None

MAX_TRAIN_EXAMPLES = 20000   # first N training pairs (None: all); also what the tokenizers learn from
MAX_VAL_EXAMPLES = 200
VOCAB_SIZE = 8000            # WordPiece vocabulary per language
LOWER_CASE = False           # lower-case both sides before learning (the tutorial did); the references keep case

# Model size (the TF tutorial's: 4 layers, d_model 128, 8 heads, dff 512).
NUM_LAYERS = 4
D_MODEL = 128
NUM_HEADS = 8
DFF = 512
MAX_LENGTH = 128             # tokens per sentence, [START]/[END] included

# Each run trains STEPS steps (one epoch limited by steps_per_epoch); the first step
# (tracing / XLA compilation) is reported apart from the steady state.
STEPS = 100
VALIDATION_STEPS = 5
BATCH_SIZE = 64              # sentences per batch, naive pipeline (the tutorial's)
MAX_TOKENS = 8192            # padded tokens per batch per side, optimized pipeline

# One training per entry: (pipeline, precision, xla). The first one is the baseline
# of the speed-ups. pipeline: "naive" (the tutorial's) or "optimized" (tokenize once,
# cache, bucket by length); precision: "off" (float32), "float16", "bfloat16" or "auto";
# xla: True/False (jit-compile the train step) or None (auto). "auto" and None are decided
# for this machine by transformer/runtime/precision.py, exactly as `scripts/train.py
# --mixed-precision auto --xla auto` decides (GPU: by compute capability; CPU: bfloat16 only
# with BF16 instructions and a measured speed-up); the training cell prints the decision.
RUNS = [
    ("naive", "off", False),
    ("optimized", "off", False),
    ("optimized", "auto", None),
]

OUTPUT_ROOT = "runs/notebook01"   # one sub-directory per run, plus comparison.md / .png
# A relative OUTPUT_ROOT is inside the repository clone, or inside MyDrive with
# SAVE_TO_DRIVE (Colab: mounts Google Drive, so results survive the runtime).
SAVE_TO_DRIVE = False
# Tokenizers are built once per corpus + vocabulary size and reused from here;
# None: OUTPUT_ROOT/tokenizers; a relative path is inside the clone (e.g. "tokenizers",
# shared with scripts/train.py).
TOKENIZER_ROOT = None

# %% [markdown]
# ## Setup
#
# On Colab this clones the repository into `COLAB_REPO_DIR` and installs its pinned
# `requirements.txt` (TensorFlow and tensorflow-text on the same minor version; on a GPU
# runtime also `tensorflow[and-cuda]`, the CUDA libraries this TensorFlow build expects).
# If pip had to upgrade a package this session had already imported, the cell stops and
# asks for **Runtime → Restart session**, then **Run all** again (the second time the
# setup finds everything in place). Outside Colab it uses the clone this notebook lives in
# and installs nothing: create the environment first (`pip install -r requirements.txt`).

# %%
import subprocess
import sys
from pathlib import Path

IN_COLAB = "google.colab" in sys.modules
if IN_COLAB:
    REPO_DIR = Path(COLAB_REPO_DIR)
    if not (REPO_DIR / "transformer").is_dir():
        if "<org>" in REPO_URL:
            raise ValueError("set REPO_URL in the parameters cell to this repository's git URL")
        subprocess.run(["git", "clone", "--depth", "1", "--branch", REPO_REF, REPO_URL, str(REPO_DIR)], check=True)
else:  # a local clone: notebooks/ is inside it; nothing is installed
    REPO_DIR = next((p for p in (Path.cwd(), *Path.cwd().parents) if (p / "transformer" / "__init__.py").is_file()),
                    None)
    if REPO_DIR is None:
        raise FileNotFoundError(f"no repository clone above {Path.cwd()}: start Jupyter inside the clone")
if str(REPO_DIR) not in sys.path:
    sys.path.insert(0, str(REPO_DIR))

from transformer.base.notebook_setup import setup  # the clone is importable from here on

DATA_DIR, OUTPUT_ROOT, TOKENIZER_ROOT = setup(REPO_DIR, IN_COLAB, DATA_DIR, DATASET, OUTPUT_ROOT, TOKENIZER_ROOT,
                                              SAVE_TO_DRIVE, caching_allocator=True)  # as scripts/train.py

# %% [markdown]
# ## Device diagnostics
#
# What TensorFlow sees (no GPU listed on a GPU runtime usually means a CUDA/driver
# mismatch: the setup cell installs `tensorflow[and-cuda]` for that), the GPU as
# `nvidia-smi` reports it, the versions every report records, and which reduced precisions
# run fast here: float16 needs tensor cores (compute capability ≥ 7.0, e.g. T4/V100),
# bfloat16 needs ≥ 8.0 on a GPU (A100, L4) or AMX/AVX512-BF16 on a CPU. These device facts
# are what precision "auto" decides from (`transformer.runtime.precision.device_facts`).

# %%
import tensorflow as tf

from transformer.measure.reports import capture_environment
from transformer.runtime.devices import visible_devices_report
from transformer.runtime.precision import device_facts

ENVIRONMENT = capture_environment()
print("TensorFlow sees:\n" + visible_devices_report())
print("\nversions: " + ", ".join(f"{name} {ENVIRONMENT[name]}"
                                 for name in ("python", "tensorflow", "tensorflow_text", "keras", "numpy")))
print(f"CPU: {ENVIRONMENT['cpu_model']} ({ENVIRONMENT['cpu_count_usable']} usable cores)")
print("\n" + (ENVIRONMENT["nvidia_smi"] or "nvidia-smi: not present (no NVIDIA GPU on this runtime)"))

GPUS = tf.config.list_physical_devices("GPU")
DEVICE = "gpu" if GPUS else "cpu"
FACTS = device_facts(DEVICE)
if GPUS:
    capability = FACTS.gpu_capability or (0, 0)
    print(f"GPU compute capability {capability}: float16 {'fast' if capability >= (7, 0) else 'slow'}, "
          f"bfloat16 {'fast' if capability >= (8, 0) else 'slow (emulated)'}")
else:
    native = f"has native support ({', '.join(FACTS.bf16_flags)})" if FACTS.bf16_flags else "is emulated (slow)"
    print(f"CPU only: float16 is slow here; bfloat16 {native}")

# Run directories are named after the hardware, so runs from different runtimes can share OUTPUT_ROOT.
DEVICE_SLUG = "cpu" if not GPUS else "-".join(ENVIRONMENT["device"].lower().split())
print(f"\nruns on this runtime will be named {DEVICE_SLUG}-…")

# %% [markdown]
# ## Short trainings
#
# The configuration every run shares (the same typed `RunConfig` that `scripts/train.py`
# builds from its flags; it is saved as `config.json` in each run directory):

# %%
import json

from transformer.base.config import DataConfig, ModelConfig, PipelineConfig, RunConfig, TokenizerConfig, TrainConfig

BASE_CONFIG = RunConfig(
    data=DataConfig(data_dir=DATA_DIR, dataset=DATASET, max_train_examples=MAX_TRAIN_EXAMPLES,
                    max_val_examples=MAX_VAL_EXAMPLES),
    tokenizer=TokenizerConfig(vocab_size=VOCAB_SIZE, lower_case=LOWER_CASE, root=str(TOKENIZER_ROOT)),  # shared by the runs
    model=ModelConfig(num_layers=NUM_LAYERS, d_model=D_MODEL, num_heads=NUM_HEADS, dff=DFF,
                      head_width="tutorial", max_length=MAX_LENGTH),
    pipeline=PipelineConfig(batch_size=BATCH_SIZE, max_tokens=MAX_TOKENS),
    train=TrainConfig(epochs=1, steps_per_epoch=STEPS, validation_steps=VALIDATION_STEPS),
).validate()
print(json.dumps(BASE_CONFIG.to_dict(), indent=1))

# %% [markdown]
# One `train()` per entry of `RUNS`. A precision of "auto" (or xla None) is resolved by
# `transformer.runtime.precision.decide_precision`, the function `train()` itself calls: the cell
# prints the decision and its reason and names the run after what was chosen; `train()`
# records the same decision in `report.json` (`run.precision_decision`). Each run directory
# holds `report.json` + `report_steps.csv` (the step-time report, written even if the run
# crashes), `summary.json`, `config.json`, checkpoints and TensorBoard logs. Running this
# cell again replaces this runtime's runs.
#
# In one Python process the runs share TensorFlow's device setup; each `train()` sets the
# Keras precision policy for itself, and the policy is set back to float32 afterwards.

# %%
import shutil

import keras

from transformer.runtime.precision import decide_precision
from transformer.training.trainer import train

REPORTS = []
for pipeline, precision, xla in RUNS:
    decision = decide_precision(precision, xla, DEVICE, pipeline)  # what train() will decide (probe cached)
    mode = "fp32" if decision.mixed_precision == "off" else decision.mixed_precision
    label = f"{DEVICE_SLUG}-{pipeline}-{mode}-{'xla' if decision.xla else 'noxla'}"
    label += "-auto" if precision == "auto" or xla is None else ""  # apart from the same settings asked for
    run_dir = OUTPUT_ROOT / label
    if run_dir.exists():
        shutil.rmtree(run_dir)  # this runtime's previous run with the same settings
    config = BASE_CONFIG.replace(
        pipeline={"kind": pipeline},
        train={"mixed_precision": precision, "xla": xla, "output_dir": str(run_dir), "label": label},
    ).validate()
    print(f"\n=== {label} ===\n{decision.summary()}")
    result = train(config)
    step_time = result.summary["step_time"]
    print(label, {key: step_time[key] for key in ("first_step_s", "mean_step_s", "tgt_tokens_per_s", "data_wait_pct")})
    REPORTS.append(run_dir / "report.json")

keras.mixed_precision.set_global_policy("float32")

# %% [markdown]
# ## Comparison
#
# Every `report.json` under `OUTPUT_ROOT` (this runtime's runs, plus runs from other
# runtimes when `OUTPUT_ROOT` is on Drive), CPU runs first: the first row is the baseline of
# the speed-ups. Steady-state figures only (the first step, with tracing and XLA
# compilation, is excluded). With few `STEPS` the numbers are noisy: the point is the
# method, raise `STEPS` for figures worth quoting.

# %%
from IPython.display import Image, Markdown, display

from transformer.measure.compare import compare

report_paths = sorted(OUTPUT_ROOT.glob("*/report.json"),
                      key=lambda path: (not path.parent.name.startswith("cpu-"), path.stat().st_mtime))
table = compare(report_paths, plot=OUTPUT_ROOT / "comparison.png", markdown=OUTPUT_ROOT / "comparison.md")
display(Markdown(table))
display(Image(filename=str(OUTPUT_ROOT / "comparison.png")))
print(f"saved {OUTPUT_ROOT / 'comparison.md'} and {OUTPUT_ROOT / 'comparison.png'}")

# %% [markdown]
# ## CPU vs GPU, honestly
#
# TensorFlow picks its devices once per process: hiding the GPU (`--device cpu`) only works
# before the first TensorFlow operation, so one notebook session cannot train on the CPU
# and then on the GPU. Two ways to get the comparison:
#
# * **On Colab**: set `SAVE_TO_DRIVE = True`, run all on a **CPU** runtime, switch to a
#   **T4 GPU** runtime (Runtime → Change runtime type) and run all again. Both runtimes
#   write to the same `OUTPUT_ROOT` on Drive (run directories are named after the
#   hardware), so the second comparison shows the CPU and T4 runs side by side with the
#   CPU baseline first. Keep every other parameter the same between the two sessions.
# * **From a terminal** on a GPU machine: `scripts/benchmark.py` runs every cell of a
#   pipeline × precision × XLA matrix in its own process, so `--device cpu` and
#   `--device gpu` both work on one machine:
#
#   ```bash
#   python scripts/benchmark.py --device cpu --steps 100 --output runs/bench-cpu
#   python scripts/benchmark.py --device gpu --steps 100 --precisions off float16 --xla off on --output runs/bench-gpu
#   python scripts/compare_reports.py runs/bench-cpu/*/report.json runs/bench-gpu/*/report.json --plot cpu_vs_gpu.png
#   ```
#
# What to look at: *tokens/s* (real target tokens, fair across batch sizes) rather than
# s/step when the batching differs; the *data wait* column says whether a run is
# input-bound (then a faster device will not help, the pipeline will); float16 helps on
# a T4 and not on a CPU; XLA's compilation cost is in the first step and in `Total (s)`.
