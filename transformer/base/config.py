"""Typed run configuration: one dataclass per stage, merged into `RunConfig`.

The config flows one way: CLI flags → `RunConfig` → every stage (data, tokenizers,
pipeline, model, training, reports, export). It is saved as `config.json` beside every
checkpoint; on `--resume` the *model* section is read back from there so a typo on the
command line cannot silently change the architecture.

`from_dict` is strict: an unknown key or a value of the wrong type is an error that names
the key (nanoGPT's "overrides fail loudly").

Size: over ~350 lines on purpose: the whole config schema (every section and its validation)
is read in one place, with the strict loader beside it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from transformer.base import atomic
from transformer.base.constants import (
    BUDGET_CLOCKS,
    DEVICES,
    FUSED_KERNEL_MODES,
    HEAD_WIDTHS,
    LAYER_NORMS,
    LENGTH_GRIDS,
    LR_SCALINGS,
    LR_SCHEDULES,
    PIPELINE_KINDS,
    PRECISIONS,
    STRATEGIES,
    TIE_EMBEDDINGS,
    TOKENIZER_ALGORITHMS,
    TRAINING_BATCHES,
    XLA_CACHE_MODES,
    one_of,
)

DEFAULT_TFDS_DATASET = "ted_hrlr_translate/pt_to_en"


def parse_profile_steps(text: str) -> tuple[int, int]:
    """`"A:B"` → (A, B): profile training steps A..B, 1-based and inclusive, 1 <= A <= B."""
    first, sep, last = str(text).partition(":")
    try:
        first_step, last_step = int(first), int(last)
    except ValueError:
        raise ValueError(f"profile steps must be A:B with integers A <= B (e.g. 5:7), got {text!r}") from None
    if not sep or first_step < 1 or last_step < first_step:
        raise ValueError(f"profile steps must be A:B with 1 <= A <= B (e.g. 5:7), got {text!r}")
    return first_step, last_step


def parse_length_buckets(text: str) -> Optional[tuple[int, ...]]:
    """`--length-buckets` value → None for a named grid (auto | width | geometric), else its lengths.

    Explicit lengths are comma-separated, strictly increasing integers > 0 (e.g. "16,32,64,128").
    """
    if text in LENGTH_GRIDS:
        return None
    try:
        lengths = tuple(int(item) for item in str(text).split(","))
    except ValueError:
        raise ValueError(f"must be {one_of(LENGTH_GRIDS)} or increasing lengths such as 16,32,64,128, "
                         f"got {text!r}") from None
    if any(n <= 0 for n in lengths) or list(lengths) != sorted(set(lengths)):
        raise ValueError(f"must be increasing lengths > 0 (e.g. 16,32,64,128), got {text!r}")
    return lengths


UNBOUNDED_EPOCHS = 1_000_000  # `fit` epochs of a time-budgeted run: the budget stops it first
AUTO = "auto"  # `--max-tokens auto`, `--num-layers auto`: chosen for the device at the start of training
RECIPE_MAX_TOKENS = 2048  # the default recipe's tokens per batch, measured on CPU (docs/recipes.md)


@dataclass(frozen=True)
class CorpusSpec:
    """One local corpus of a (weighted) mixture: `--data PATH[:WEIGHT]`.

    path: a directory with `train.{src}`/`train.{tgt}` (and optionally `validation.*`), or a
      file-pair prefix: `PATH.{src}` / `PATH.{tgt}` (e.g. `extra/train.blivre_nheb`).
    weight: how often its pairs are drawn relative to its size: 1 = once per epoch, 0.5 =
      half of them per epoch (a fresh random half each epoch), 2 = twice (transformer/data/mixing.py).
    """

    path: str
    weight: float = 1.0

    def __str__(self) -> str:  # as typed on the command line
        return self.path if self.weight == 1.0 else f"{self.path}:{self.weight:g}"


@dataclass(frozen=True)
class DataConfig:
    """Where the parallel corpus comes from.

    Exactly one source is used, in this order of precedence: explicit files
    (`train_src`/`train_tgt`/`val_src`/`val_tgt`), local corpora (`corpora`, the `--data`
    flags; or `data_dir`, one directory, as written by older config.json files and the Python
    API), or the TFDS dataset `dataset`.
    """

    dataset: str = DEFAULT_TFDS_DATASET
    tfds_data_dir: Optional[str] = None
    data_dir: Optional[str] = None  # one corpus directory: the same as corpora=(CorpusSpec(data_dir),)
    corpora: tuple[CorpusSpec, ...] = ()  # several local corpora with sampling weights (--data)
    train_src: Optional[str] = None
    train_tgt: Optional[str] = None
    val_src: Optional[str] = None
    val_tgt: Optional[str] = None
    src_lang: str = "pt"
    tgt_lang: str = "en"
    max_train_examples: Optional[int] = None  # take the first N training pairs (quick runs)
    max_val_examples: Optional[int] = None

    @property
    def local_corpora(self) -> tuple[CorpusSpec, ...]:
        """The local corpora to mix: `corpora`, or `data_dir` as one corpus; () for TFDS/explicit files."""
        return self.corpora or ((CorpusSpec(self.data_dir),) if self.data_dir else ())

    def validate(self) -> None:
        for name in ("max_train_examples", "max_val_examples"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"data.{name} must be > 0 (or unset for all), got {getattr(self, name)}")
        if self.data_dir and self.corpora:
            raise ValueError("data.data_dir and data.corpora are two ways to give the corpora: use one")
        for spec in self.corpora:
            if not spec.path:
                raise ValueError("data.corpora: empty path")
            if not (spec.weight > 0 and spec.weight < float("inf")):
                raise ValueError(f"data.corpora: weight of {spec.path} must be a positive number, got {spec.weight}")


@dataclass(frozen=True)
class TokenizerConfig:
    """Subword vocabulary learning: WordPiece (tensorflow-text `bert_vocab_from_dataset`) or a
    SentencePiece unigram model (the `sentencepiece` package; applied with tensorflow-text)."""

    algorithm: str = "wordpiece"  # wordpiece | sentencepiece (a unigram model; can sample segmentations)
    vocab_size: int = 8000  # target size per language; the learned vocab is close to it
    lower_case: bool = False  # the default recipe keeps case (references are cased); the tutorial lower-cases
    root: str = "tokenizers"  # built tokenizers go to <root>/<key>/
    learn_max_examples: Optional[int] = None  # learn the vocab from at most N sentences
    shared_vocab: bool = False  # one vocab learned on both languages (vocab_size in total), saved as src and tgt

    def validate(self) -> None:
        if self.algorithm not in TOKENIZER_ALGORITHMS:
            raise ValueError(f"tokenizer.algorithm must be {one_of(TOKENIZER_ALGORITHMS)}, got {self.algorithm!r}")
        if self.vocab_size <= 4:  # [PAD] [UNK] [START] [END]
            raise ValueError(f"tokenizer.vocab_size must exceed the 4 reserved tokens, got {self.vocab_size}")
        if self.learn_max_examples is not None and self.learn_max_examples <= 0:
            raise ValueError(f"tokenizer.learn_max_examples must be > 0 (or unset), got {self.learn_max_examples}")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture only (nanoGPT's GPTConfig): restored from the checkpoint on resume.

    Defaults are the default recipe (docs/recipes.md); `presets.PRESETS["tutorial"]` holds
    the TF tutorial's sizes (4 layers, d_model 128, dff 512, tutorial head width).

    head_width: "tutorial" uses key_dim = d_model per head (the TF tutorial's choice);
    "paper" uses key_dim = d_model // num_heads (Vaswani et al.).
    num_layers: layers per side, or "auto" (the default recipe's, `RunConfig().model`): decided
    for the machine when training starts (transformer/training/depth.py) and saved as a number.
    """

    num_layers: Union[int, str] = 3  # int | "auto" (see above)
    d_model: int = 256
    num_heads: int = 8
    dff: int = 1024
    # 0.2 from epoch train.dropout_from_epoch: a 30-minute run on a fast BF16 CPU passes over the pairs 8 times
    # and overfits with 0.1 (docs/recipes.md, 'Dropout 0.2 from epoch 3')
    dropout_rate: float = 0.2
    head_width: str = "paper"
    max_length: int = 128  # tokens per sequence, including [START]/[END]
    src_vocab_size: int = 0  # filled in from the tokenizers
    tgt_vocab_size: int = 0
    tie_embeddings: str = "none"  # none | output (projection = target embedding) | all (+ source; shared vocab)
    layer_norm: str = "post"  # post (Vaswani, tutorial) | pre (x + f(LN(x)), final LN on both stacks)
    attention_dropout: Optional[float] = None  # dropout on attention probabilities; None: dropout_rate
    activation_dropout: float = 0.0  # dropout on the FFN's ReLU outputs

    @property
    def key_dim(self) -> int:
        return self.d_model if self.head_width == "tutorial" else self.d_model // self.num_heads

    def validate(self) -> None:
        if self.head_width not in HEAD_WIDTHS:
            raise ValueError(f"model.head_width must be {one_of(HEAD_WIDTHS)}, got {self.head_width!r}")
        if self.head_width == "paper" and self.d_model % self.num_heads:
            raise ValueError(
                f"model.d_model ({self.d_model}) must be divisible by model.num_heads "
                f"({self.num_heads}) with head_width='paper'"
            )
        if self.num_layers != AUTO and (not isinstance(self.num_layers, int) or self.num_layers <= 0):
            raise ValueError(f"model.num_layers must be > 0 or {AUTO!r}, got {self.num_layers!r}")
        for name in ("d_model", "num_heads", "dff", "max_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")
        for name in ("dropout_rate", "attention_dropout", "activation_dropout"):
            rate = getattr(self, name)
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {rate}")
        if self.tie_embeddings not in TIE_EMBEDDINGS:
            raise ValueError(f"model.tie_embeddings must be {one_of(TIE_EMBEDDINGS)}, got {self.tie_embeddings!r}")
        if self.layer_norm not in LAYER_NORMS:
            raise ValueError(f"model.layer_norm must be {one_of(LAYER_NORMS)}, got {self.layer_norm!r}")
        if (self.tie_embeddings == "all" and self.src_vocab_size and self.tgt_vocab_size
                and self.src_vocab_size != self.tgt_vocab_size):
            raise ValueError(
                f"model.tie_embeddings 'all' needs one vocabulary for both languages (--shared-vocab), got "
                f"src_vocab_size {self.src_vocab_size} != tgt_vocab_size {self.tgt_vocab_size}")


# ModelConfig fields that shape no weight: a run started from another run's weights
# (`--init-from`) may set its own; the other fields are that run's architecture.
FINE_TUNE_MODEL_FIELDS = ("dropout_rate", "attention_dropout", "activation_dropout")


# TrainConfig fields a resumed run keeps from its config.json: the optimizer's state (its EMA shadows) depends on
# them, and the epoch its dropout starts belongs to the run too.
RUN_TRAIN_FIELDS = ("ema_decay", "ema_every", "dropout_from_epoch")
# A run's config.json written before the field existed: its dropout ran from the first epoch.
LEGACY_TRAIN_VALUES = {"dropout_from_epoch": 1}


@dataclass(frozen=True)
class PipelineConfig:
    """How token batches are built (see transformer/data/pipeline.py).

    kind "optimized": tokenize once + cache, bucket by length with a token budget per batch
    (`max_tokens`) over a bounded set of padded shapes. kind "naive": the TF tutorial's
    pipeline (shuffle → batch `batch_size` sentences → tokenize every step → pad to max).

    max_tokens: padded tokens per batch per side; None: `batch_size` sentences; "auto":
    decided when training starts (RECIPE_MAX_TOKENS on CPU, a probed budget on a GPU,
    transformer/runtime/batch_size.py). A saved config.json holds the resolved int.
    length_buckets: the padded lengths (`pipeline.length_grid`). "width": multiples of
    `bucket_width` (little padding, ~max_length / bucket_width shapes); "geometric": 16, 24, 32,
    48, 64, 96, … (each ≤ 1.5× the one before: ~2 shapes per doubling of max_length, for XLA,
    which compiles one program per shape; evaluation batches are then padded to full rows too);
    or explicit lengths "16,32,64,128". "auto": geometric when the train step is XLA-compiled,
    else width (resolved by training and saved in config.json).
    training_batches: "planned": with the memory cache and no subword sampling, each epoch's
    batches are planned at once from the ids in memory (`epoch_plan`: one full shuffle, then
    the batches bucketing makes); "streamed": tf.data's shuffle buffer and
    `bucket_by_sequence_length` over the cached stream (what file caches and sampling use).
    """

    kind: str = "optimized"
    batch_size: int = 64  # sentences per batch (naive pipeline; optimized when max_tokens is None)
    max_tokens: Union[int, str, None] = AUTO  # int | None | "auto" (see above)
    shuffle_buffer: int = 20000
    cache: str = "memory"  # "memory", or a file path prefix for tf.data's file cache
    bucket_width: int = 4  # padded lengths are multiples of this → a bounded set of shapes (docs/speed.md)
    length_buckets: str = "auto"  # auto | width | geometric | "L1,L2,…" (see the docstring)
    # Subword regularisation (Kudo 2018), training batches only: each pass over the training
    # pairs samples a fresh SentencePiece segmentation of every sentence from its `subword_nbest`
    # best (-1: the whole lattice) with inverse temperature `subword_alpha` (smaller: more varied);
    # 0: off, the one best segmentation, as in evaluation and export.
    subword_alpha: float = 0.0
    subword_nbest: int = 64
    training_batches: str = "planned"  # planned | streamed (see the docstring)

    @property
    def sampling(self) -> Optional[tuple[int, float]]:
        """(nbest, alpha) of training segmentations, or None: deterministic segmentation."""
        return (self.subword_nbest, self.subword_alpha) if self.subword_alpha > 0 else None

    def validate(self) -> None:
        if not math.isfinite(self.subword_alpha) or self.subword_alpha < 0:
            raise ValueError(f"pipeline.subword_alpha must be >= 0 (0 = no sampling), got {self.subword_alpha}")
        if self.subword_nbest != -1 and self.subword_nbest < 2:
            raise ValueError(f"pipeline.subword_nbest must be -1 (the whole lattice) or >= 2, got {self.subword_nbest}")
        if self.training_batches not in TRAINING_BATCHES:
            raise ValueError(f"pipeline.training_batches must be {one_of(TRAINING_BATCHES)}, got {self.training_batches!r}")
        if self.kind not in PIPELINE_KINDS:
            raise ValueError(f"pipeline.kind must be {one_of(PIPELINE_KINDS)}, got {self.kind!r}")
        if self.batch_size <= 0:
            raise ValueError(f"pipeline.batch_size must be > 0, got {self.batch_size}")
        if isinstance(self.max_tokens, str) and self.max_tokens != AUTO:
            raise ValueError(f"pipeline.max_tokens must be a number of tokens or {AUTO!r}, got {self.max_tokens!r}")
        if isinstance(self.max_tokens, int) and self.max_tokens <= 0:
            raise ValueError(f"pipeline.max_tokens must be > 0, got {self.max_tokens}")
        if self.bucket_width <= 0:
            raise ValueError(f"pipeline.bucket_width must be > 0, got {self.bucket_width}")
        try:
            parse_length_buckets(self.length_buckets)
        except ValueError as err:
            raise ValueError(f"pipeline.length_buckets {err}") from None


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and runtime settings (not part of the architecture)."""

    epochs: Optional[int] = None  # None: 1, or no limit with a time budget (see planned_epochs)
    steps_per_epoch: Optional[int] = None  # None: one full pass over the training split
    validation_steps: Optional[int] = None
    seed: int = 0
    time_budget_minutes: Optional[float] = None  # stop after this much training time (transformer/training/budget.py)
    budget_clock: str = "train"  # train: steps only | wall: everything from start-up to the final evaluation
    eval_at: tuple[float, ...] = (0.5, 0.8)  # under a budget: evaluate at these fractions of it, and at the end
    lr_schedule: str = "cosine"  # cosine | inverse-sqrt (transformer/model/schedule.py)
    peak_learning_rate: Optional[float] = 1e-3  # None: (d_model · warmup)^-0.5 (inverse-sqrt only)
    warmup_steps: int = 200
    # The schedule follows the batch (transformer/model/schedule.py `scale_for_batch`): peak_learning_rate and
    # warmup_steps are given for batches of lr_reference_tokens; a batch k times larger gets warmup_steps / k
    # and peak × min(√k, √2). lr_scaling: auto (= off, measured) | sqrt | off.
    lr_scaling: str = "auto"
    lr_reference_tokens: int = RECIPE_MAX_TOKENS
    # k, once applied: peak_learning_rate and warmup_steps then hold the scaled values (config.json).
    # None: not applied yet (a config from the command line).
    lr_batch_factor: Optional[float] = None
    label_smoothing: float = 0.1
    # late dropout: every dropout off before this epoch (1-based; 1 = from the start), on from it
    # (transformer/training/late_dropout.py; chosen by 30-minute runs, docs/recipes.md)
    dropout_from_epoch: int = 3
    # gradient accumulation: each optimizer update sums the gradients of this many micro-batches of the
    # pipeline's size (the effective batch is N times larger, the memory that of one micro-batch);
    # steps, the schedule and step-time reports count updates (transformer/model/accumulation.py)
    accumulate_steps: int = 1
    bleu_sentences: int = 256  # validation pairs decoded for BLEU/chrF during training (0: off)
    bleu_every_steps: Optional[int] = None  # None: at eval_at under a budget, else at the end of every epoch
    early_stop_patience: Optional[int] = None  # stop after N BLEU evaluations without a new best
    checkpoint_every_steps: Optional[int] = None  # also checkpoint every N steps (not only per epoch)
    keep_checkpoints: int = 5  # latest checkpoints kept (checkpoint averaging reads them)
    # exponential moving average of the weights (transformer/model/ema.py): None = off, else the decay
    # (e.g. 0.999), the shadow updated every `ema_every` optimizer steps; saved as <run>/ema/ at the end
    ema_decay: Optional[float] = None
    ema_every: int = 4
    device: str = "auto"  # auto | cpu | gpu
    mixed_precision: str = "auto"  # auto | off | float16 | bfloat16 (auto: transformer/runtime/precision.py)
    xla: Optional[bool] = None  # None: auto (transformer/runtime/precision.py); True/False: --xla/--no-xla
    xla_warmup: bool = True  # with XLA: compile every planned batch shape at the start, at once (training/xla_warmup.py)
    xla_cache: str = "auto"  # XLA's persistent program cache: auto | off | a directory (runtime/xla_cache.py, xla_cache_dir)
    fused_kernels: str = "auto"  # auto | on | off: C++ layer norm + attention softmax, CPU training (runtime/fused_kernels.py)
    output_dir: str = "runs/latest"
    resume: bool = False
    # --init-from: a new run starting from another run's weights (transformer/training/init_from.py)
    init_from: Optional[str] = None  # that run's directory
    init_checkpoint: str = "latest"  # which of its weights: latest | best | averaged | ema | a checkpoint prefix
    init_from_step: Optional[int] = None  # the optimizer step of those weights in that run (filled at start)
    verbose: int = 1
    label: str = ""  # name of the run in step-time reports (default: output directory name)
    probe_peak: bool = True  # measure peak FLOP/s with a ~1 s matmul probe for utilisation
    strategy: str = "auto"  # auto | one-device | mirrored | multi-worker | tpu (transformer/runtime/distribute.py)
    backup_every_steps: Optional[int] = None  # mid-epoch BackupAndRestore snapshots every N steps
    auto_batch: bool = False  # on out-of-memory: restore, halve the batch (down to the floor), continue
    auto_batch_floor: Optional[int] = None  # smallest max_tokens (or batch_size); None: training.py's default
    profile_steps: Optional[str] = None  # "A:B": profile steps A..B (transformer/training/profiling.py)

    @property
    def planned_epochs(self) -> int:
        """Epochs `fit` may run: `epochs`, or 1 — or no practical limit with a time budget."""
        if self.epochs is not None:
            return self.epochs
        return 1 if self.time_budget_minutes is None else UNBOUNDED_EPOCHS

    @property
    def planned_steps(self) -> Optional[int]:
        """Optimizer steps the run plans: epochs × steps_per_epoch; None if unknown or time-budgeted."""
        if self.steps_per_epoch is None or self.time_budget_minutes is not None:
            return None
        return self.planned_epochs * self.steps_per_epoch

    def validate(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"train.device must be {one_of(DEVICES)}, got {self.device!r}")
        if self.mixed_precision not in PRECISIONS:
            raise ValueError(f"train.mixed_precision must be {one_of(PRECISIONS)}, got {self.mixed_precision!r}")
        if self.epochs is not None and self.epochs <= 0:
            raise ValueError(f"train.epochs must be > 0, got {self.epochs}")
        if self.time_budget_minutes is not None and self.time_budget_minutes <= 0:
            raise ValueError(f"train.time_budget_minutes must be > 0, got {self.time_budget_minutes}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"train.lr_schedule must be {one_of(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if self.lr_schedule == "cosine" and self.peak_learning_rate is None:
            raise ValueError("train.lr_schedule 'cosine' needs train.peak_learning_rate (--peak-lr)")
        if self.peak_learning_rate is not None and self.peak_learning_rate <= 0:
            raise ValueError(f"train.peak_learning_rate must be > 0, got {self.peak_learning_rate}")
        if self.warmup_steps <= 0:
            raise ValueError(f"train.warmup_steps must be > 0, got {self.warmup_steps}")
        if self.lr_scaling not in LR_SCALINGS:
            raise ValueError(f"train.lr_scaling must be {one_of(LR_SCALINGS)}, got {self.lr_scaling!r}")
        if self.lr_reference_tokens <= 0:
            raise ValueError(f"train.lr_reference_tokens must be > 0, got {self.lr_reference_tokens}")
        if self.lr_batch_factor is not None and not 0 < self.lr_batch_factor < float("inf"):
            raise ValueError(f"train.lr_batch_factor must be > 0, got {self.lr_batch_factor}")
        if self.budget_clock not in BUDGET_CLOCKS:
            raise ValueError(f"train.budget_clock must be {one_of(BUDGET_CLOCKS)}, got {self.budget_clock!r}")
        if any(not 0.0 < f < 1.0 for f in self.eval_at) or list(self.eval_at) != sorted(set(self.eval_at)):
            raise ValueError(f"train.eval_at must be increasing fractions in (0, 1), got {list(self.eval_at)}")
        if self.bleu_sentences < 0:
            raise ValueError(f"train.bleu_sentences must be >= 0, got {self.bleu_sentences}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ValueError(f"train.ema_decay must be in (0, 1), e.g. 0.999 (or unset: no EMA), got {self.ema_decay}")
        if isinstance(self.ema_every, bool) or not isinstance(self.ema_every, int) or self.ema_every < 1:
            raise ValueError(f"train.ema_every must be an integer >= 1 (optimizer steps), got {self.ema_every!r}")
        if self.keep_checkpoints <= 0:
            raise ValueError(f"train.keep_checkpoints must be > 0, got {self.keep_checkpoints}")
        if self.steps_per_epoch is not None and self.steps_per_epoch <= 0:
            raise ValueError(f"train.steps_per_epoch must be > 0, got {self.steps_per_epoch}")
        if self.validation_steps is not None and self.validation_steps <= 0:
            raise ValueError(f"train.validation_steps must be > 0 (or unset: the whole validation split), "
                             f"got {self.validation_steps}")
        if isinstance(self.accumulate_steps, bool) or not isinstance(self.accumulate_steps, int) \
                or self.accumulate_steps < 1:
            raise ValueError(f"train.accumulate_steps must be an integer >= 1, got {self.accumulate_steps!r}")
        if isinstance(self.dropout_from_epoch, bool) or not isinstance(self.dropout_from_epoch, int) \
                or self.dropout_from_epoch < 1:
            raise ValueError(f"train.dropout_from_epoch must be an integer >= 1 (1: dropout from the first epoch), "
                             f"got {self.dropout_from_epoch!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"train.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"train.strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.profile_steps is not None:
            parse_profile_steps(self.profile_steps)
        if self.init_from is not None and not self.init_from.strip():
            raise ValueError("train.init_from must be a run directory, got ''")
        if not self.init_checkpoint.strip():
            raise ValueError("train.init_checkpoint must be latest, best, averaged, ema or a checkpoint prefix, got ''")
        if self.fused_kernels not in FUSED_KERNEL_MODES:
            raise ValueError(f"train.fused_kernels must be {one_of(FUSED_KERNEL_MODES)}, got {self.fused_kernels!r}")
        if not self.xla_cache.strip():
            raise ValueError(f"train.xla_cache must be {', '.join(XLA_CACHE_MODES)} or a directory, got ''")
        for name in ("backup_every_steps", "auto_batch_floor", "bleu_every_steps", "early_stop_patience",
                     "checkpoint_every_steps"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"train.{name} must be > 0, got {getattr(self, name)}")


PROJECTION_DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class DecodeConfig:
    """How the Translator decodes (not part of the model; saved with an export).

    beam_size: 1 = greedy, else beam search with the GNMT length penalty `alpha`.
    max_output_ratio, max_output_extra: output tokens ≤ ceil(ratio · source tokens) + extra
        (and ≤ the model's max_length). 1.5 / 10 holds for 99.94% of the bible-pt-en
        training pairs; it stops degenerate repetition early.
    chunk_size: sentences decoded together (after sorting by length).
    jit_compile: compile the decode loop with XLA.
    length_bucket: with jit_compile, source lengths are padded to a multiple of this.
    drop_finished: without jit_compile, finished rows leave the batch once the rows still
        decoding are at most this fraction of those computed (0: never).
    projection_dtype: without jit_compile, the output projection's matmul dtype: "float32",
        "bfloat16" (logits rounded to bfloat16 before the float32 bias) or "auto" (the model's
        compute dtype: bfloat16 for a bfloat16 export, where it decoded 1.12-1.15x faster with
        BLEU within 0.05 on an AMX Xeon, docs/speed.md; float32 otherwise).
    streams: chunks decoded at once, each by its own loop (chunks k, k + streams, … go to
        loop k); a decoder step is bound by its many small kernels, so on a few cores the
        loops overlap their dispatch. On 2 cores, with TensorFlow's default thread pools, two
        loops gave 1.41× the sentences/s of one and three the same as two; with the pools of
        `runtime.threads.decoding_threads` (one intra-op thread), three gave 1.46× (float32)
        and 1.63× (bfloat16) the default pools' two (docs/speed.md, "Thread settings").
    cut_over: a source over this many tokens is cut after its sentence ends and its sentences
        translated alone; a piece still over the model's max_length - 2 is cut after its commas
        (transformer/inference/segmenting.py). 0 or a value over max_length - 2: only sources
        the model cannot take whole are cut. The models learn from verses of 1-3 sentences:
        40 scored higher than 0 on validation with two models (docs/serving.md).
    """

    beam_size: int = 1  # greedy: beam 4 gains ~1.3 BLEU at a fraction of the speed (docs/recipes.md, Decoding)
    alpha: float = 1.0  # tuned on validation (grid 0.2 / 0.6 / 1.0 with beam 4, docs/recipes.md)
    max_output_ratio: float = 1.5
    max_output_extra: int = 10
    chunk_size: int = 128
    jit_compile: bool = False
    length_bucket: int = 16
    drop_finished: float = 0.75
    projection_dtype: str = "auto"
    streams: int = 3
    cut_over: int = 40  # validation BLEU +0.5 on verses, +2.5 on lines of 4 verses (docs/serving.md)

    def validate(self) -> "DecodeConfig":
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if self.alpha < 0:
            raise ValueError(f"alpha (the length-penalty exponent) must be >= 0, got {self.alpha}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.max_output_ratio <= 0 or self.max_output_extra < 0:
            raise ValueError("max_output_ratio must be > 0 and max_output_extra >= 0, got "
                             f"{self.max_output_ratio} / {self.max_output_extra}")
        if self.length_bucket < 1:
            raise ValueError(f"length_bucket must be >= 1, got {self.length_bucket}")
        if not 0 <= self.drop_finished < 1:
            raise ValueError(f"drop_finished must be in [0, 1), got {self.drop_finished}")
        if self.projection_dtype not in PROJECTION_DTYPES:
            raise ValueError(f"projection_dtype must be one of {', '.join(PROJECTION_DTYPES)}, got "
                             f"{self.projection_dtype!r}")
        if self.projection_dtype == "bfloat16" and self.jit_compile:
            raise ValueError(f"projection_dtype {self.projection_dtype} needs the lean step: not with jit_compile")
        if self.streams < 1:
            raise ValueError(f"streams must be >= 1, got {self.streams}")
        if self.cut_over < 0:
            raise ValueError(f"cut_over must be >= 0 (0 = the model's max_length - 2), got {self.cut_over}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; saved as config.json with each checkpoint."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=lambda: ModelConfig(num_layers=AUTO))  # depth: for the machine
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> "RunConfig":
        self.data.validate()
        self.tokenizer.validate()
        self.model.validate()
        self.pipeline.validate()
        self.train.validate()
        if self.model.tie_embeddings == "all" and not self.tokenizer.shared_vocab:
            raise ValueError("model.tie_embeddings 'all' (--tie-embeddings all) needs tokenizer.shared_vocab "
                             "(--shared-vocab): the source and target embeddings are one matrix")
        if not (self.train.resume or self.train.init_from):  # those take the tokenizers of the run: checked then
            check_sampling(self)
        return self

    def replace(self, **sections: Any) -> "RunConfig":
        """Returns a copy with whole sections or `section={field: value}` overrides."""
        updates = {}
        for name, value in sections.items():
            current = getattr(self, name)
            updates[name] = dataclasses.replace(current, **value) if isinstance(value, dict) else value
        return dataclasses.replace(self, **updates)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, *, source: str = "config") -> "RunConfig":
        return _from_dict(cls, values, source)

    def save(self, path: str | Path) -> None:
        atomic.write_json(path, self.to_dict(), sort_keys=True)

    @classmethod
    def load(cls, path: str | Path) -> "RunConfig":
        path = Path(path)
        try:
            values = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"config file not found: {path}") from None
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if isinstance(values, dict) and isinstance(values.get("train"), dict):  # a run's config.json: complete
            values = {**values, "train": {**LEGACY_TRAIN_VALUES, **values["train"]}}
        return cls.from_dict(values, source=str(path))


def check_sampling(config: RunConfig) -> None:
    """ValueError when segmentations are to be sampled (`pipeline.subword_alpha` > 0) from a tokenizer that cannot."""
    if config.pipeline.sampling and config.tokenizer.algorithm != "sentencepiece":
        raise ValueError(f"pipeline.subword_alpha {config.pipeline.subword_alpha} samples segmentations of a "
                         f"SentencePiece model; the tokenizer is {config.tokenizer.algorithm} "
                         "(add --tokenizer sentencepiece, or drop --subword-alpha)")


def _from_dict(cls: type, values: dict, source: str) -> Any:
    """Builds dataclass `cls` from `values`, rejecting unknown keys and wrong types."""
    if not isinstance(values, dict):
        raise TypeError(f"{source}: expected a mapping for {cls.__name__}, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise KeyError(f"{source}: unknown key(s) {unknown} for {cls.__name__}; known: {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
        hint = hints[name]
        key = f"{source}.{name}"
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _from_dict(hint, value, key)
        else:
            kwargs[name] = _check_type(value, hint, key)
    return cls(**kwargs)


def _check_type(value: Any, hint: Any, key: str) -> Any:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:  # Optional[X], or Union[X, Y, None]: the first that fits
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) > 1:
            for option in options:
                try:
                    return _check_type(value, option, key)
                except TypeError:
                    pass
            raise TypeError(f"{key}: expected {' or '.join(o.__name__ for o in options)}, got {value!r}")
        hint = options[0]
    if typing.get_origin(hint) is tuple:  # tuple[X, ...]: a JSON list (or a tuple) of X
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{key}: expected a list, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_from_dict(item, v, f"{key}[{i}]") if dataclasses.is_dataclass(item)
                     else _check_type(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is bool and not isinstance(value, bool):
        raise TypeError(f"{key}: expected bool, got {value!r}")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{key}: expected int, got {value!r}")
    if not isinstance(value, hint):
        raise TypeError(f"{key}: expected {hint.__name__}, got {value!r}")
    return value
