"""Command-line flags shared by the scripts, mapped onto the typed config.

Each `add_*_args` adds one config section's flags; `run_config_from_args` builds the
`RunConfig` from the parsed namespace. Flags left unset keep the dataclass defaults, so the
defaults live in one place (transformer/base/config.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from transformer.base import startup_chatter
from transformer.base.config import (
    AUTO,
    FINE_TUNE_MODEL_FIELDS,
    PROJECTION_DTYPES,
    RECIPE_MAX_TOKENS,
    RUN_TRAIN_FIELDS,
    CorpusSpec,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    RunConfig,
    TokenizerConfig,
    TrainConfig,
    check_sampling,
    parse_length_buckets,
    parse_profile_steps,
)
from transformer.base.constants import (
    BUDGET_CLOCKS,
    CHECKOUT_DIR,
    CHECKPOINT_CHOICES,
    CTRANSLATE2_COMPUTE_TYPES,
    DEVICES,
    EXPORT_MANIFEST,
    FUSED_KERNEL_MODES,
    HEAD_WIDTHS,
    LAYER_NORMS,
    LR_SCALINGS,
    LR_SCHEDULES,
    ONEDNN_CHOICES,
    PIPELINE_KINDS,
    PRECISIONS,
    SHARED_CORPUS_DIR,
    STRATEGIES,
    TIE_EMBEDDINGS,
    TOKENIZER_ALGORITHMS,
    TRAINING_BATCHES,
    XLA_MODES,
)
from transformer.base.errors import ArtifactError, ConfigError
from transformer.base.presets import PRESETS
from transformer.base.versions import check_versions

GPU_GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"  # read by TensorFlow when it creates its GPU devices


def quiet_tensorflow() -> None:
    """Hides TensorFlow's C++ start-up chatter (CUDA probing on CPU machines) and its Python
    side's INFO lines; logs this project's INFO lines."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    startup_chatter.hide_on_import()  # what the variable cannot hide: the CUDA probe's lines
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # TensorFlow's Python side logs at INFO, through absl (a line per checkpoint, "Sharding callback
    # duration"; the SavedModel writer's renamed inputs, thousands of characters) and through its
    # own logger (a SavedModel's "Assets written to: <the staging directory>").
    for name in ("absl", "tensorflow"):
        logging.getLogger(name).setLevel(logging.WARNING)


# modules of transformer/commands/, each with main(argv)
COMMANDS = ("train", "build_tokenizers", "translate", "evaluate", "export", "average_checkpoints", "benchmark",
            "benchmark_decoding", "compare_reports", "tune_decoding", "serve", "benchmark_serving", "benchmark_subword",
            "benchmark_ema", "benchmark_xla", "benchmark_pipeline")


def command_line(name: str, *args: str) -> list[str]:
    """argv that runs command `name` of *this* checkout in a new Python process (with `subprocess_env`)."""
    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r}; one of {', '.join(COMMANDS)}")
    return [sys.executable, "-m", f"transformer.commands.{name}", *map(str, args)]


def subprocess_env(env: dict | None = None) -> dict:
    """`env` (default: os.environ) with this checkout first on PYTHONPATH, so a child process
    imports this package, installed or not, whatever its working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT_DIR), *filter(None, [env.get("PYTHONPATH")])])
    return env


def start() -> None:
    """What every command does first, before TensorFlow is imported: quiet TensorFlow's start-up
    chatter, configure logging, let TensorFlow take GPU memory as it needs it, and check that
    TensorFlow and tensorflow-text match (else `error: …` with the pip command that fixes it,
    exit status 2, through `errors.command`)."""
    quiet_tensorflow()
    # GPU memory as needed, not all of it at start: a decoding command, a server or a second
    # run beside a training run (or the tests' workers) would otherwise find none left
    # (`cudaSetDevice() … out of memory`, seen on an H100). A value you set wins.
    os.environ.setdefault(GPU_GROWTH_ENV, "true")
    check_versions()  # VersionMismatchError: `error:`/`hint:`, exit 2 (transformer/base/errors.py `command`)


def add_data_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--dataset", help=f"TFDS dataset name (default {DataConfig.dataset})")
    group.add_argument("--tfds-data-dir", help="TFDS data directory (manual downloads go in <dir>/downloads/manual)")
    group.add_argument("--data", dest="corpora", action="append", type=parse_data_arg, metavar="PATH[:WEIGHT][,...]",
                       help="local corpus: a directory with train.pt/train.en[/validation.pt/validation.en], or a "
                            "file-pair prefix PATH (PATH.pt, PATH.en); repeat it or separate with commas to mix "
                            "several, each with an optional sampling weight (default 1 = once per epoch); "
                            "validation comes from the first directory that has one")
    group.add_argument("--train-src", help="training source file (one sentence per line)")
    group.add_argument("--train-tgt", help="training target file, line-aligned with --train-src")
    group.add_argument("--val-src", help="validation source file")
    group.add_argument("--val-tgt", help="validation target file")
    group.add_argument("--max-train-examples", type=int, help="use only the first N training pairs")
    group.add_argument("--max-val-examples", type=int, help="use only the first N validation pairs")


def parse_data_arg(text: str) -> tuple[CorpusSpec, ...]:
    """`--data` value → corpus specs: `PATH[:WEIGHT]`, several separated by commas.

    A `:WEIGHT` suffix is read as a weight when it looks like a number; it must be > 0.
    Raises argparse.ArgumentTypeError (argparse prints `error: argument --data: …`).
    """
    specs = []
    for item in text.split(","):
        path, weight = item.strip(), 1.0
        head, sep, tail = path.rpartition(":")
        if sep and head and not tail.startswith(("/", "\\")):
            try:
                weight = float(tail)
            except ValueError:
                if Path(path).exists():  # a path with a colon in it
                    specs.append(CorpusSpec(path))
                    continue
                raise argparse.ArgumentTypeError(
                    f"{text!r}: weight {tail!r} of {head!r} is not a number (PATH[:WEIGHT], e.g. {head}:0.5)") from None
            path = head
        if not path:
            raise argparse.ArgumentTypeError(f"{text!r}: empty corpus path")
        if not (0 < weight < float("inf")):
            raise argparse.ArgumentTypeError(f"{text!r}: weight of {path!r} must be a positive number, got {tail}")
        specs.append(CorpusSpec(path, weight))
    return tuple(specs)


def _int_or_auto(text: str, expected: str) -> int | str:
    """"auto" (any case), or `text` as an int; else an argparse error "'text': expected <expected>"."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {expected}") from None


def parse_max_tokens(text: str) -> int | str:
    """`--max-tokens` value: "auto", or a number of tokens (0: sentences, `--batch-size`)."""
    # a negative count is refused by PipelineConfig.validate, as every range is
    return _int_or_auto(text, f"a number of tokens (e.g. 8192), 0 for --batch-size sentences, or {AUTO!r}")


def parse_num_layers(text: str) -> int | str:
    """`--num-layers` value: a number of layers per side, or "auto"."""
    return _int_or_auto(text, f"a number of layers per side (e.g. 3) or {AUTO!r}")


def parse_fractions(text: str) -> tuple[float, ...]:
    """`--eval-at` value: comma-separated fractions in (0, 1), or `end` for none."""
    if text.strip() == "end":
        return ()
    try:
        fractions = tuple(float(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected fractions such as 0.5,0.8 (or 'end')") from None
    if any(not 0.0 < f < 1.0 for f in fractions) or list(fractions) != sorted(set(fractions)):
        raise argparse.ArgumentTypeError(f"{text!r}: fractions must be increasing, each between 0 and 1")
    return fractions


def add_tokenizer_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tokenizers")
    group.add_argument("--tokenizer", dest="tokenizer_algorithm", choices=TOKENIZER_ALGORITHMS,
                       help="subword vocabulary: wordpiece (default) or a sentencepiece unigram model (which "
                            "--subword-alpha can sample from)")
    group.add_argument("--vocab-size", type=int, help=f"subword vocab size per language (default {TokenizerConfig.vocab_size})")
    group.add_argument("--cased", dest="lower_case", action="store_false", default=None,
                       help="keep case and accents (the default recipe)")
    group.add_argument("--lower-case", dest="lower_case", action="store_true", default=None,
                       help="lower-case and strip accents (the TF tutorial's choice)")
    group.add_argument("--tokenizers-root", dest="tokenizer_root", help="where built tokenizers go (default tokenizers/)")
    group.add_argument("--shared-vocab", dest="shared_vocab", action=argparse.BooleanOptionalAction, default=None,
                       help="one vocabulary learned on both languages (--vocab-size in total)")


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument("--num-layers", type=parse_num_layers, metavar="N|auto",
                       help="layers per side (default auto: 2 for a --time-budget run in float32 on a CPU without "
                            "BF16 instructions, else 3; transformer/training/depth.py)")
    group.add_argument("--d-model", type=int)
    group.add_argument("--num-heads", type=int)
    group.add_argument("--dff", type=int)
    group.add_argument("--dropout", dest="dropout_rate", type=float)
    group.add_argument("--head-width", choices=HEAD_WIDTHS,
                       help="tutorial: key_dim = d_model; paper: key_dim = d_model / heads")
    group.add_argument("--max-length", type=int, help="max tokens per sentence (longer ones are truncated)")
    group.add_argument("--tie-embeddings", choices=TIE_EMBEDDINGS,
                       help="output: the output projection is the target embedding transposed; all: also the "
                            "source embedding (needs --shared-vocab); default none")
    group.add_argument("--layer-norm", choices=LAYER_NORMS, help="post-norm (default) or pre-norm blocks")
    group.add_argument("--attention-dropout", type=float, help="dropout on attention weights (default: --dropout)")
    group.add_argument("--activation-dropout", type=float, help="dropout on the FFN's ReLU outputs (default 0)")


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("input pipeline")
    group.add_argument("--pipeline", dest="pipeline_kind", choices=PIPELINE_KINDS)
    group.add_argument("--batch-size", type=int, help="sentences per batch (naive pipeline, or optimized with --max-tokens 0)")
    group.add_argument("--max-tokens", type=parse_max_tokens, metavar="N|auto",
                       help="padded tokens per batch per side (optimized pipeline; 0 = use --batch-size); default "
                            f"auto: {RECIPE_MAX_TOKENS} on CPU, on a GPU the largest budget that fits its memory and "
                            "still raises tokens/s (a short probe, cached; see --lr-scaling)")
    group.add_argument("--bucket-width", type=int,
                       help="padded lengths are multiples of this (optimized pipeline; default 4): smaller = "
                            "less padding, more distinct shapes (XLA compiles one program per shape)")
    group.add_argument("--length-buckets", type=_length_buckets, metavar="{auto,width,geometric,L1,L2,...}",
                       help="padded lengths of the optimized pipeline: width = multiples of --bucket-width; "
                            "geometric = 16,24,32,48,64,96,128 (few shapes for XLA; evaluation batches padded to "
                            "full rows); or explicit lengths; default auto = geometric with XLA, else width")
    group.add_argument("--shuffle-buffer", type=int)
    group.add_argument("--subword-alpha", type=float, metavar="A",
                       help="subword regularisation (needs --tokenizer sentencepiece): every epoch samples a new "
                            "segmentation of each training sentence with inverse temperature A (smaller: more "
                            "varied; e.g. 0.1); 0 = off (default). Evaluation and export segment deterministically")
    group.add_argument("--subword-nbest", type=int, metavar="N",
                       help="sample among the N best segmentations (-1: all; default 64)")
    group.add_argument("--cache", help="'memory' or a file path prefix for tf.data's file cache")
    group.add_argument("--training-batches", choices=TRAINING_BATCHES,
                       help="planned (default): with the memory cache and no --subword-alpha, each epoch's batches "
                            "are planned at once from the ids in memory (one full shuffle; cheap enough to feed a "
                            "GPU); streamed: tf.data's shuffle buffer and bucketing over the cached stream")


def add_train_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("training")
    group.add_argument("--preset", choices=sorted(PRESETS), default="default",
                       help="named recipe the other flags override (transformer/base/presets.py; default: default)")
    group.add_argument("--epochs", type=int, help="epochs (default 1; with --time-budget: until the budget is spent)")
    group.add_argument("--time-budget", dest="time_budget_minutes", type=float, metavar="MINUTES",
                       help="train until this much time is spent (see --budget-clock), then checkpoint, evaluate and stop")
    group.add_argument("--budget-clock", choices=BUDGET_CLOCKS,
                       help="what --time-budget counts: train = training steps only (default); wall = everything "
                            "from start-up to the final evaluation, so the run ends on time")
    group.add_argument("--eval-at", type=parse_fractions, metavar="F[,F...]",
                       help="under --time-budget: validation loss + BLEU at these fractions of the budget, and at "
                            "the end (default 0.5,0.8; 'end' = only at the end)")
    group.add_argument("--lr-schedule", choices=LR_SCHEDULES,
                       help="inverse-sqrt (paper/tutorial) or cosine decay over the planned run / time budget")
    group.add_argument("--peak-lr", dest="peak_learning_rate", type=float,
                       help="learning rate at the end of warmup (inverse-sqrt default: (d_model*warmup)^-0.5)")
    group.add_argument("--lr-scaling", choices=LR_SCALINGS,
                       help="follow the batch: a batch k× --lr-reference-tokens gets --warmup-steps / k and "
                            "--peak-lr × min(√k, √2); auto (default): off, the recipe's schedule at any batch "
                            "(measured, docs/batch-size.md)")
    group.add_argument("--lr-reference-tokens", type=int, metavar="N",
                       help=f"tokens per batch that --peak-lr and --warmup-steps are given for (default {RECIPE_MAX_TOKENS})")
    group.add_argument("--bleu-sentences", type=int,
                       help="validation pairs decoded for BLEU/chrF during training (0 = off)")
    group.add_argument("--bleu-every-steps", type=int, help="validation BLEU every N steps (default: every epoch)")
    group.add_argument("--early-stop-patience", type=int,
                       help="stop after N validation-BLEU evaluations without a new best")
    group.add_argument("--checkpoint-every-steps", type=int, help="also checkpoint every N steps (for averaging)")
    group.add_argument("--keep-checkpoints", type=int, help="latest checkpoints kept (default 5)")
    group.add_argument("--ema-decay", type=float, metavar="D",
                       help="keep an exponential moving average of the weights with decay D (e.g. 0.999; warmed "
                            "up as min(D, (1+step)/(10+step))) beside the model, saved in every checkpoint and at "
                            "the end as <run>/ema/ (--checkpoint ema); the raw weights stay the run's latest. "
                            "Default: off")
    group.add_argument("--ema-every", type=int, metavar="K",
                       help=f"update the average every K optimizer steps, with decay D^K (default {TrainConfig.ema_every})")
    group.add_argument("--steps-per-epoch", type=int)
    group.add_argument("--validation-steps", type=int, metavar="N",
                       help="validate on the first N batches of the validation split, the same ones at every "
                            "epoch (default: the whole split)")
    group.add_argument("--seed", type=int)
    group.add_argument("--warmup-steps", type=int)
    group.add_argument("--label-smoothing", type=float)
    group.add_argument("--dropout-from-epoch", type=int, metavar="E",
                       help="late dropout: train epochs 1..E-1 without any dropout (faster, and quicker to learn "
                            "while far from overfitting), then with the model's rates; 1: from the start "
                            f"(default {TrainConfig.dropout_from_epoch}; --preset tutorial: 1)")
    group.add_argument("--accumulate-steps", type=_accumulate_steps, metavar="N",
                       help="gradient accumulation: each optimizer update sums N micro-batches of --max-tokens "
                            "(or --batch-size): an N× larger batch in the memory of one; steps, the schedule and "
                            "reports count updates (default 1)")
    group.add_argument("--device", choices=DEVICES)
    group.add_argument("--mixed-precision", choices=PRECISIONS,
                       help="Keras mixed precision (default auto: decided from the device and a short probe, "
                            "see transformer/runtime/precision.py)")
    group.add_argument("--xla", nargs="?", const="on", choices=XLA_MODES,
                       help="jit_compile the train step: --xla (= on), --no-xla (= off), --xla auto (default: "
                            "on for a GPU when the run is long enough to repay the compilations, off on CPU; "
                            "see transformer/runtime/precision.py)")
    group.add_argument("--no-xla", dest="xla", action="store_const", const="off", help="same as --xla off")
    group.add_argument("--xla-warmup", dest="xla_warmup", action=argparse.BooleanOptionalAction, default=None,
                       help="with XLA, compile the programs of every planned batch shape before the first step, "
                            "all at once from threads (default on; --no-xla-warmup: each when its shape first comes)")
    group.add_argument("--xla-cache", metavar="{auto,off,DIR}",
                       help="keep XLA-compiled programs across runs in this directory (default auto: "
                            "$TRANSFORMER_XLA_CACHE, else $XDG_CACHE_HOME/transformer-nmt/xla/<machine key>); "
                            "used when XLA may be on")
    group.add_argument("--fused-kernels", choices=FUSED_KERNEL_MODES,
                       help="C++ kernels for layer norm and attention softmax + dropout in CPU training, built "
                            "on first use with g++ (default auto: on for CPU without XLA when they build; "
                            "see transformer/runtime/fused_kernels.py)")
    group.add_argument("--output", dest="output_dir", help="run directory (checkpoints, logs, reports)")
    group.add_argument("--resume", action="store_true", default=None, help="continue from the last checkpoint in --output")
    group.add_argument("--init-from", metavar="RUN",
                       help="start a new run (own --output, schedule, step count and budget) from the weights of "
                            "run directory RUN, with its tokenizers and architecture (fine-tuning); see "
                            "--init-checkpoint")
    group.add_argument("--init-checkpoint", metavar="{latest,best,averaged,ema,PREFIX}",
                       help="which of RUN's weights --init-from loads: latest (default), best (by validation "
                            "BLEU), averaged, ema (RUN's moving average, --ema-decay), or a checkpoint prefix")
    group.add_argument("--verbose", type=int, choices=[0, 1, 2])
    group.add_argument("--label", help="name of this run in step-time reports (default: --output's name)")
    group.add_argument("--no-probe-peak", dest="probe_peak", action="store_false", default=None,
                       help="skip the ~1 s matmul probe that measures peak FLOP/s for utilisation")
    group.add_argument("--strategy", choices=STRATEGIES,
                       help="tf.distribute strategy (default auto: multi-worker if TF_CONFIG has a cluster, "
                            "mirrored if >1 GPU, else one device); batch flags are per replica")
    group.add_argument("--backup-every-steps", type=int,
                       help="back up model + optimizer every N steps (BackupAndRestore); a restarted run resumes there")
    group.add_argument("--auto-batch", action="store_true", default=None,
                       help="on out-of-memory, restore the last checkpoint/backup and retry at half the batch")
    group.add_argument("--auto-batch-floor", type=int,
                       help="smallest --max-tokens (or --batch-size) --auto-batch goes down to")
    group.add_argument("--profile-steps", type=_profile_steps, metavar="A:B",
                       help="profile training steps A..B (1-based, inclusive) into the TensorBoard directory "
                            "and add a device-time breakdown by op category to report.json")


def _length_buckets(text: str) -> str:
    try:
        parse_length_buckets(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _accumulate_steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of micro-batches >= 1 (e.g. 4)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: the micro-batches per update must be >= 1 (1 = no accumulation)")
    return value


def _profile_steps(text: str) -> str:
    try:
        parse_profile_steps(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


XLA_CHOICES = {"on": True, "off": False, "auto": None}  # --xla value → TrainConfig.xla


def _pick(args: argparse.Namespace, names: dict[str, str]) -> dict:
    """{config field: value} for the flags that were given (not None)."""
    return {field: getattr(args, dest) for field, dest in names.items()
            if getattr(args, dest, None) is not None}


def run_config_from_args(args: argparse.Namespace, base: RunConfig | None = None) -> RunConfig:
    """Overrides `base` (default: the `--preset`, else RunConfig()) with every flag that was given."""
    base = base or PRESETS[getattr(args, "preset", None) or "default"]
    data = _pick(args, {f: f for f in DataConfig.__dataclass_fields__})
    if data.get("corpora"):  # one tuple per --data flag → one tuple
        data["corpora"] = tuple(spec for specs in data["corpora"] for spec in specs)
    tokenizer = _pick(args, {"algorithm": "tokenizer_algorithm", "vocab_size": "vocab_size", "lower_case": "lower_case",
                             "root": "tokenizer_root",
                             "shared_vocab": "shared_vocab"})
    model = _pick(args, {f: f for f in ModelConfig.__dataclass_fields__})
    typed_model = {k: v for k, v in model.items() if v != AUTO}  # `--num-layers auto` contradicts no saved run
    pipeline = _pick(args, {"kind": "pipeline_kind", "batch_size": "batch_size", "max_tokens": "max_tokens",
                            "shuffle_buffer": "shuffle_buffer", "cache": "cache",
                            "bucket_width": "bucket_width", "length_buckets": "length_buckets",
                            "subword_alpha": "subword_alpha", "subword_nbest": "subword_nbest",
                            "training_batches": "training_batches"})
    if pipeline.get("max_tokens") == 0:
        pipeline["max_tokens"] = None
    train = _pick(args, {f: f for f in TrainConfig.__dataclass_fields__})
    if "xla" in train:
        train["xla"] = XLA_CHOICES[train["xla"]]
    try:
        config = base.replace(data=data, tokenizer=tokenizer, model=model, pipeline=pipeline, train=train).validate()
    except (ValueError, TypeError) as err:  # validate() names the config key; add the flag
        raise ConfigError(f"{err}{_flag_note(str(err))}") from err
    if config.train.resume:
        check_resume_flags(config.train.output_dir, {"model": typed_model, "tokenizer": tokenizer,
                                                     "train": {k: v for k, v in train.items() if k in RUN_TRAIN_FIELDS}})
    if config.train.init_from:
        config = apply_init_from(config, {"model": typed_model, "tokenizer": tokenizer})
        try:  # the tokenizers are the run's now
            check_sampling(config)
        except ValueError as err:
            raise ConfigError(f"--init-from {config.train.init_from}: {err}") from err
    return config


def saved_conflicts(saved: RunConfig, given: dict[str, dict]) -> list[tuple[str, object, object]]:
    """[(section.key, given value, saved value)] where `given` ({section: {key: value}}) contradicts `saved`
    (the tokenizers' root, where they are built, is no contradiction)."""
    return [(f"{section}.{key}", value, getattr(getattr(saved, section), key))
            for section, values in given.items() for key, value in values.items()
            if key != "root" and getattr(getattr(saved, section), key) != value]


def resume_conflicts(run_dir: str, given: dict[str, dict]) -> list[tuple[str, object, object]]:
    """`saved_conflicts` with `run_dir`/config.json; [] when there is no saved config yet (a fresh run with --resume)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return []
    try:
        saved = RunConfig.load(path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ArtifactError(f"{path} is damaged: {err}",
                            hint="restore it, or train a new run in another --output") from err
    return saved_conflicts(saved, given)


def _conflict_lines(conflicts: list[tuple[str, object, object]]) -> str:
    """"--d-model 32 (the run has model.d_model = 16); …": each contradicting flag as typed, with both values."""
    return "; ".join(f"{_typed_flag(key.split('.')[-1], typed)} (the run has {key} = {saved!r})"
                     for key, typed, saved in conflicts)


def _typed_flag(key: str, value: object) -> str:
    """The flag and value as typed on the command line for config key `key`."""
    if isinstance(value, bool):  # the switches: --lower-case / --cased, --shared-vocab / --no-shared-vocab
        if key == "lower_case":
            return "--lower-case" if value else "--cased"
        flag = _FLAG_NAMES.get(key, key.replace("_", "-"))
        return f"--{flag}" if value else f"--no-{flag}"
    return f"--{_FLAG_NAMES.get(key, key.replace('_', '-'))} {value}"


def check_resume_flags(run_dir: str, given: dict[str, dict]) -> None:
    """ConfigError listing the typed flags that contradict the run's saved config.json (with --resume)."""
    conflicts = resume_conflicts(run_dir, given)
    if conflicts:
        raise ConfigError(f"--resume: {len(conflicts)} flag(s) contradict {run_dir}/config.json: "
                          + _conflict_lines(conflicts),
                          hint="drop those flags to continue the run as it was, or train a new run in another --output")


def apply_init_from(config: RunConfig, given: dict[str, dict]) -> RunConfig:
    """`config` with the architecture and tokenizer settings of the run it starts from (`--init-from RUN`).

    `given`: the model and tokenizer flags typed ({section: {key: value}}). A typed flag that
    contradicts RUN's config.json is a ConfigError listing every such flag with both values;
    the dropout rates (FINE_TUNE_MODEL_FIELDS) are the new run's own. A missing or damaged RUN
    is an ArtifactError starting `--init-from RUN:`.
    """
    run = config.train.init_from
    path = Path(run) / "config.json"
    if not Path(run).is_dir():
        raise ArtifactError(f"--init-from {run}: run directory not found",
                            hint="give the --output directory of a finished training run")
    if Path(run).resolve() == Path(config.train.output_dir).resolve():
        raise ConfigError(f"--init-from {run}: that is this run's own --output",
                          hint="--resume continues a run; --init-from starts a new one in another --output")
    try:
        saved = RunConfig.load(path)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ArtifactError(f"--init-from {run}: {path} is missing or damaged: {err}",
                            hint="give the --output directory of a finished training run") from err
    architecture = {"model": {k: v for k, v in given.get("model", {}).items() if k not in FINE_TUNE_MODEL_FIELDS},
                    "tokenizer": given.get("tokenizer", {})}
    conflicts = saved_conflicts(saved, architecture)
    if conflicts:
        raise ConfigError(f"--init-from {run}: {len(conflicts)} flag(s) contradict {path}: "
                          + _conflict_lines(conflicts),
                          hint="drop those flags: the architecture and tokenizers come from the run the weights do")
    model = {k: v for k, v in given.get("model", {}).items() if k in FINE_TUNE_MODEL_FIELDS}
    return config.replace(model=dataclasses.replace(saved.model, **model),
                          tokenizer=dataclasses.replace(saved.tokenizer, root=config.tokenizer.root))


_FLAG_NAMES = {"dropout_rate": "dropout", "time_budget_minutes": "time-budget", "peak_learning_rate": "peak-lr",
               "lr_batch_factor": "lr-scaling",
               "kind": "pipeline", "root": "tokenizers-root", "data_dir": "data", "algorithm": "tokenizer",
               "beam_size": "beam"}


def _flag_note(message: str) -> str:
    """" (flag --x)" for the `section.key` a config error message starts with."""
    key = message.split(" ", 1)[0].split(".")[-1]
    if not key.isidentifier():
        return ""
    return f" (flag --{_FLAG_NAMES.get(key, key.replace('_', '-'))})"


def add_decode_args(parser) -> None:
    """Adds the DecodeConfig flags (--beam, --alpha, --max-output-*, --chunk-size, --xla, --drop-finished,
    --streams, --cut-over) to a parser."""
    defaults = DecodeConfig()
    group = parser.add_argument_group("decoding")
    group.add_argument("--beam", type=int, default=defaults.beam_size, help="beam size (1 = greedy)")
    group.add_argument("--alpha", type=float, default=defaults.alpha, help="GNMT length-penalty exponent (beam search)")
    group.add_argument("--max-output-ratio", type=float, default=defaults.max_output_ratio,
                       help="output tokens <= ratio * source tokens + extra")
    group.add_argument("--max-output-extra", type=int, default=defaults.max_output_extra)
    group.add_argument("--chunk-size", type=int, default=defaults.chunk_size, help="sentences decoded together")
    group.add_argument("--xla", action=argparse.BooleanOptionalAction, default=defaults.jit_compile,
                       help="compile the decode loop with XLA")
    group.add_argument("--drop-finished", type=float, default=defaults.drop_finished, metavar="FRACTION",
                       help="without XLA, finished sentences leave the batch once those still decoding are at most "
                            f"this fraction of it (0 = never; default {defaults.drop_finished})")
    group.add_argument("--projection-dtype", choices=PROJECTION_DTYPES, default=defaults.projection_dtype,
                       help="without XLA, the output projection's matmul dtype; bfloat16 rounds the logits; "
                            "auto: bfloat16 for a --dtype bfloat16 model, else float32 (docs/speed.md; default "
                            f"{defaults.projection_dtype})")
    group.add_argument("--streams", type=int, default=defaults.streams,
                       help=f"chunks decoded at once, each by its own loop (default {defaults.streams})")
    group.add_argument("--cut-over", type=int, default=defaults.cut_over, metavar="TOKENS",
                       help="a source over this many tokens is cut after its sentence ends and its sentences "
                            "translated alone (a piece over the model's max_length - 2 also after its commas); "
                            f"0 = only sources over max_length - 2 (default {defaults.cut_over})")


def add_thread_args(parser) -> None:
    """Adds --intra-op-threads / --inter-op-threads: TensorFlow's CPU thread pools of a decoding command."""
    group = parser.add_argument_group("threads")
    group.add_argument("--intra-op-threads", type=int, metavar="N",
                       help="threads one TensorFlow op may use (default: 1 when the model decodes several streams, "
                            "else one per core; 0 = TensorFlow's default)")
    group.add_argument("--inter-op-threads", type=int, metavar="N",
                       help="TensorFlow ops run at once (default: one per decoding stream, at least one per core; "
                            "0 = TensorFlow's default)")
    group.add_argument("--onednn", choices=ONEDNN_CHOICES, default=ONEDNN_CHOICES[0],
                       help="TensorFlow's oneDNN ops: auto (default: off for a float32 model, TensorFlow's choice for "
                            "bfloat16), default (TensorFlow decides: on with AVX-512 BF16/VNNI or AMX), on or off; set "
                            "before TensorFlow starts (docs/speed.md, \"oneDNN's ops\")")


def add_compute_type_arg(parser) -> None:
    """Adds --compute-type: what CTranslate2 computes in when MODEL is a CTranslate2 export."""
    parser.add_argument("--compute-type", choices=CTRANSLATE2_COMPUTE_TYPES,
                        help="for a CTranslate2 export (export.py --format ctranslate2): CTranslate2's compute type, "
                             "e.g. int8 (default float32); refused for other models")


def model_dtype(path: str | Path) -> str:
    """The compute dtype a decoding command's MODEL runs in, read without TensorFlow.

    An export's translator.json names it ("dtype", written by `export.py --dtype`; float32 when
    absent or unreadable); a run directory decodes in float32.
    """
    manifest = Path(path) / EXPORT_MANIFEST
    try:
        dtype = json.loads(manifest.read_text()).get("dtype", "float32") if manifest.is_file() else "float32"
    except (OSError, ValueError, AttributeError):  # not ours to judge here: loading the model reports it
        return "float32"
    return dtype if isinstance(dtype, str) else "float32"


def check_thread_args(args) -> None:
    """ConfigError naming the flag when --intra-op-threads / --inter-op-threads is negative."""
    for flag in ("intra_op_threads", "inter_op_threads"):
        value = getattr(args, flag)
        if value is not None and value < 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 0 (0 = TensorFlow's default), got {value}")


def add_checkpoint_arg(parser) -> None:
    """Adds --checkpoint: which weights of a training run directory to load."""
    parser.add_argument("--checkpoint", default=CHECKPOINT_CHOICES[0],
                        help="for a run directory: latest (default), best (by validation BLEU), averaged "
                             "(scripts/average_checkpoints.py), ema (the moving average of a run trained with "
                             "--ema-decay) or a checkpoint prefix")


def add_run_split_args(parser) -> None:
    """Adds --run, --checkpoint, --data and --split: a run's weights and the split they are measured on."""
    parser.add_argument("--run", required=True, help="training run directory")
    add_checkpoint_arg(parser)
    parser.add_argument("--data", default=str(SHARED_CORPUS_DIR),
                        help=f"directory with {{split}}.pt/.en (default {SHARED_CORPUS_DIR})")
    parser.add_argument("--split", default="validation", help="split name (default validation)")


def add_batching_args(parser) -> None:
    """Adds the server's batching flags (transformer-serve and its load benchmark):
    --max-batch, --max-wait-ms, --batching, --decoder-streams."""
    parser.add_argument("--max-batch", type=int,
                        help="most sentences per decoder call (default the model's chunk_size, as offline)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0,
                        help="longest a request waits for others to join its batch (default 5)")
    parser.add_argument("--batching", choices=("step", "run"), default="run",
                        help="step: sentences join and leave a running decode between steps (greedy without XLA; "
                             "else run); run: length-sorted runs, each decoded to its end (default run)")
    parser.add_argument("--decoder-streams", type=int,
                        help="with run batching, decoder calls running at once (default 2); with step "
                             "batching, running batches, one thread each (default 1)")


def check_batching_args(args) -> None:
    """ConfigError naming the flag when a flag of `add_batching_args` is out of range."""
    for flag in ("max_batch", "decoder_streams"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be > 0, got {value}")
    if args.max_wait_ms < 0:
        raise ConfigError(f"--max-wait-ms must be >= 0, got {args.max_wait_ms}")


def decode_config_from_args(args) -> DecodeConfig:
    """DecodeConfig from the flags of `add_decode_args`; a bad value is a ConfigError naming its flag."""
    try:
        return DecodeConfig(beam_size=args.beam, alpha=args.alpha, max_output_ratio=args.max_output_ratio,
                            max_output_extra=args.max_output_extra, chunk_size=args.chunk_size,
                            jit_compile=args.xla, drop_finished=args.drop_finished,
                            projection_dtype=args.projection_dtype,
                            streams=args.streams, cut_over=args.cut_over).validate()
    except ValueError as err:
        raise ConfigError(f"{err}{_flag_note(str(err))}") from err
