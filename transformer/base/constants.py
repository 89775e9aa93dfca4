"""Names shared by every layer, without TensorFlow: special token ids and the choice lists.

Each choice tuple is the one definition of what a flag / config field accepts: `config.py`
validates against it, `cli.py` offers it as argparse `choices`, and the modules that act on
the choice (devices, distribute, pipeline, schedule, rundir) read it from here.
"""

from __future__ import annotations

import os
from pathlib import Path

# ---- where things are: this checkout, and the offline corpus shared beside it
CHECKOUT_DIR = Path(__file__).resolve().parents[2]  # holds transformer/, scripts/, tests/
SHARED_CORPUS = Path("shared", "data", "bible-pt-en")  # beside the clone: <clone>/../shared/... (read in place)
SHARED_CORPUS_DIR = CHECKOUT_DIR.parent / SHARED_CORPUS

# ---- special tokens: the first four entries of every vocabulary (tokenizer.py writes them)
RESERVED_TOKENS = ("[PAD]", "[UNK]", "[START]", "[END]")
PAD_ID, UNK_ID, START_ID, END_ID = 0, 1, 2, 3

# ---- choice lists
DEVICES = ("auto", "cpu", "gpu")  # --device
PRECISION_MODES = ("off", "float16", "bfloat16")  # explicit --mixed-precision values
PRECISIONS = ("auto", *PRECISION_MODES)  # --mixed-precision (auto: transformer/runtime/precision.py decides)
XLA_MODES = ("auto", "on", "off")  # --xla
FUSED_KERNEL_MODES = ("auto", "on", "off")  # --fused-kernels (transformer/runtime/fused_kernels.py)
STRATEGIES = ("auto", "one-device", "mirrored", "multi-worker", "tpu")  # --strategy
PIPELINE_KINDS = ("optimized", "naive")  # --pipeline
TRAINING_BATCHES = ("planned", "streamed")  # --training-batches (transformer/data/epoch_plan.py)
TOKENIZER_ALGORITHMS = ("wordpiece", "sentencepiece")  # --tokenizer (transformer/data/tokenizer.py)
LENGTH_GRIDS = ("auto", "width", "geometric")  # --length-buckets (or explicit lengths; transformer/data/pipeline.py)
XLA_CACHE_MODES = ("auto", "off")  # --xla-cache (or a directory; transformer/runtime/xla_cache.py)
ONEDNN_CHOICES = ("auto", "default", "on", "off")  # --onednn of the decoding commands (transformer/runtime/onednn.py)
CTRANSLATE2_COMPUTE_TYPES = ("float32", "int8", "int8_float32", "int16", "bfloat16", "int8_bfloat16",
                             "default")  # --compute-type of a CTranslate2 export (its weights are float32)
EXPORT_MANIFEST = "translator.json"  # an export's description (decode and model config, dtype), SavedModel or CTranslate2
HEAD_WIDTHS = ("tutorial", "paper")  # --head-width
TIE_EMBEDDINGS = ("none", "output", "all")  # --tie-embeddings (transformer/model/tied.py)
LAYER_NORMS = ("post", "pre")  # --layer-norm
LR_SCHEDULES = ("inverse-sqrt", "cosine")  # --lr-schedule
LR_SCALINGS = ("auto", "sqrt", "off")  # --lr-scaling (transformer/model/schedule.py `scale_for_batch`)
BUDGET_CLOCKS = ("train", "wall")  # --budget-clock (transformer/training/budget.py)
CHECKPOINT_CHOICES = ("latest", "best", "averaged", "ema")  # --checkpoint (or an explicit checkpoint prefix)


def user_cache_dir() -> Path:
    """This project's per-user cache: `$XDG_CACHE_HOME/transformer-nmt` (default `~/.cache/transformer-nmt`);
    the precision probe, XLA's programs and the fused kernels keep their files under it."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transformer-nmt"


def one_of(choices: tuple) -> str:
    """"a, b or c" for error messages."""
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]
