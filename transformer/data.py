"""Parallel corpora: TFDS datasets or local line-aligned text files.

Every source becomes a `ParallelCorpus`: train and validation `tf.data.Dataset`s of
`(source_sentence, target_sentence)` scalar tf.string pairs, plus a `fingerprint` that
identifies the exact data (used to key tokenizer directories).

Local files are validated up front and errors name the file and line: a missing file,
unequal line counts, invalid UTF-8, an empty corpus. Pairs where either side is empty
(after stripping) are dropped and counted.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tensorflow as tf

from transformer.config import DataConfig

log = logging.getLogger(__name__)


class CorpusError(ValueError):
    """Bad corpus input; the message names the file (and line) at fault."""


@dataclass
class ParallelCorpus:
    """Sentence pairs ready for tokenization.

    train / validation: datasets of (src: tf.string [], tgt: tf.string []).
    name: short human-readable source name (used in tokenizer directory keys).
    fingerprint: hex digest identifying the training data exactly.
    """

    name: str
    fingerprint: str
    train: tf.data.Dataset
    validation: Optional[tf.data.Dataset]
    num_train: Optional[int] = None  # None when unknown without a full pass (TFDS)
    num_validation: Optional[int] = None
    dropped_empty: int = 0


def load_corpus(config: DataConfig) -> ParallelCorpus:
    """Loads the corpus that `config` selects (explicit files > data_dir > TFDS)."""
    if any((config.train_src, config.train_tgt, config.val_src, config.val_tgt)):
        if not (config.train_src and config.train_tgt):
            raise CorpusError("--train-src and --train-tgt must be given together")
        if bool(config.val_src) != bool(config.val_tgt):
            raise CorpusError("--val-src and --val-tgt must be given together")
        return _local_corpus(
            Path(config.train_src), Path(config.train_tgt),
            Path(config.val_src) if config.val_src else None,
            Path(config.val_tgt) if config.val_tgt else None,
            config,
        )
    if config.data_dir:
        root = Path(config.data_dir)
        if not root.is_dir():
            raise CorpusError(f"--data directory not found: {root}")
        val_src = root / f"validation.{config.src_lang}"
        val_tgt = root / f"validation.{config.tgt_lang}"
        has_val = val_src.exists() or val_tgt.exists()
        return _local_corpus(
            root / f"train.{config.src_lang}", root / f"train.{config.tgt_lang}",
            val_src if has_val else None, val_tgt if has_val else None,
            config,
        )
    return _tfds_corpus(config)


def read_parallel_files(src_path: Path, tgt_path: Path) -> tuple[list[str], list[str], int]:
    """Reads two line-aligned UTF-8 files.

    Returns (src_lines, tgt_lines, dropped) where pairs with an empty side are dropped.
    Raises CorpusError naming the file and line for: missing file, invalid UTF-8,
    unequal line counts, no non-empty pair.
    """
    src_lines = _read_lines(src_path)
    tgt_lines = _read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        shorter, longer = (src_path, tgt_path) if len(src_lines) < len(tgt_lines) else (tgt_path, src_path)
        raise CorpusError(
            f"line counts differ: {src_path} has {len(src_lines)} lines, {tgt_path} has "
            f"{len(tgt_lines)}; {shorter} ends at line {min(len(src_lines), len(tgt_lines))}, "
            f"{longer} continues (line {min(len(src_lines), len(tgt_lines)) + 1})"
        )
    kept_src, kept_tgt = [], []
    for src, tgt in zip(src_lines, tgt_lines):
        src, tgt = src.strip(), tgt.strip()
        if src and tgt:
            kept_src.append(src)
            kept_tgt.append(tgt)
    if not kept_src:
        raise CorpusError(f"empty corpus: no non-empty sentence pairs in {src_path} / {tgt_path}")
    return kept_src, kept_tgt, len(src_lines) - len(kept_src)


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise CorpusError(f"{path}:{line}: invalid UTF-8 ({err.reason} at byte {err.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # trailing newline
    return [line.rstrip("\r") for line in lines]


def _local_corpus(
    train_src: Path, train_tgt: Path, val_src: Optional[Path], val_tgt: Optional[Path], config: DataConfig
) -> ParallelCorpus:
    src, tgt, dropped = read_parallel_files(train_src, train_tgt)
    src, tgt = src[: config.max_train_examples], tgt[: config.max_train_examples]
    digest = hashlib.sha256()
    for line in src + tgt:
        digest.update(line.encode("utf-8") + b"\n")
    validation, num_val = None, None
    if val_src is not None:
        vsrc, vtgt, vdropped = read_parallel_files(val_src, val_tgt)
        vsrc, vtgt = vsrc[: config.max_val_examples], vtgt[: config.max_val_examples]
        dropped += vdropped
        validation, num_val = tf.data.Dataset.from_tensor_slices((vsrc, vtgt)), len(vsrc)
    if dropped:
        log.warning("dropped %d sentence pairs with an empty side", dropped)
    return ParallelCorpus(
        name=train_src.parent.name or "local",
        fingerprint=digest.hexdigest(),
        train=tf.data.Dataset.from_tensor_slices((src, tgt)),
        validation=validation,
        num_train=len(src),
        num_validation=num_val,
        dropped_empty=dropped,
    )


def _tfds_corpus(config: DataConfig) -> ParallelCorpus:
    """A TFDS translation dataset through `tfds.load` (downloads and prepares it if needed).

    `tfds.load(..., as_supervised=True)` yields `(src, tgt)` pairs in the dataset's
    supervised order (pt, en for `ted_hrlr_translate/pt_to_en`). Pairs with an empty side
    are filtered out lazily, so `num_train` / `num_validation` are the split sizes (capped
    by `max_*_examples`) before that filter, and `dropped_empty` stays 0 (unknown without a
    full pass). The validation split is used when the dataset has one.
    """
    import tensorflow_datasets as tfds

    def load(split: str, **kwargs):
        return tfds.load(config.dataset, split=split, data_dir=config.tfds_data_dir, as_supervised=True,
                         shuffle_files=False, **kwargs)

    try:
        train, info = load("train", with_info=True)
    except tfds.core.registered.DatasetNotFoundError as err:
        raise CorpusError(f"--dataset {config.dataset!r}: {err}") from None
    except Exception as err:
        raise CorpusError(
            f"could not download/prepare TFDS dataset {config.dataset!r} ({type(err).__name__}: {err}). "
            "Offline? Put the dataset's archives in the TFDS manual directory "
            "(<tfds-data-dir>/downloads/manual) or use local files with --data DIR "
            "(see README, 'Training offline')."
        ) from None

    def prepare(ds: tf.data.Dataset, limit: Optional[int]) -> tf.data.Dataset:
        ds = ds.filter(_both_sides_non_empty)  # as the local path: drop pairs with an empty side
        return ds.take(limit) if limit else ds

    def size(split: str, limit: Optional[int]) -> Optional[int]:
        if split not in info.splits:  # unknown (e.g. metadata not generated)
            return None
        count = info.splits[split].num_examples
        return min(count, limit) if limit else count

    has_val = "validation" in info.splits
    return ParallelCorpus(
        name=config.dataset.replace("/", "-"),
        fingerprint=hashlib.sha256(f"tfds:{info.full_name}:{config.max_train_examples}".encode()).hexdigest(),
        train=prepare(train, config.max_train_examples),
        validation=prepare(load("validation"), config.max_val_examples) if has_val else None,
        num_train=size("train", config.max_train_examples),
        num_validation=size("validation", config.max_val_examples) if has_val else None,
    )


def _both_sides_non_empty(src: tf.Tensor, tgt: tf.Tensor) -> tf.Tensor:
    """True when neither scalar tf.string is empty after stripping whitespace."""
    return tf.logical_and(tf.strings.length(tf.strings.strip(src)) > 0,
                          tf.strings.length(tf.strings.strip(tgt)) > 0)
