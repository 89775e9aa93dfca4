"""Parallel corpora: TFDS datasets or local line-aligned text files.

Every source becomes a `ParallelCorpus`: train and validation `tf.data.Dataset`s of
`(source_sentence, target_sentence)` scalar tf.string pairs, plus a `fingerprint` that
identifies the exact data (used to key tokenizer directories).

Local files are validated up front and errors name the file and line: a missing file,
unequal line counts, invalid UTF-8, an empty corpus. Pairs where either side is empty
(after stripping) are dropped and counted.

Several local corpora (`--data A --data B:0.5`, `DataConfig.corpora`) become a weighted
`mixing.Mixture`: `train` is then one fixed epoch of it (the tokenizers learn from it) and
`training_pairs` the mixture the training pipeline draws a fresh epoch from each time. The
validation split comes from the first corpus (a directory) that has one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tensorflow as tf

from transformer.base.config import CorpusSpec, DataConfig
from transformer.base.errors import InputError
from transformer.data.mixing import LEARN_SEED, Mixture, MixturePart

log = logging.getLogger(__name__)


class CorpusError(InputError, ValueError):
    """Bad corpus input; the message names the file (and line) at fault."""

    hint = "fix the file and line named above (UTF-8 text, one sentence per line, both sides the same length)"


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
    mixture: Optional[Mixture] = None  # local corpora: the weighted parts (train is one fixed epoch of it)

    @property
    def training_pairs(self):
        """What the training pipeline reads: the `Mixture` (fresh draws each epoch), else `train`."""
        return self.mixture if self.mixture is not None and not self.mixture.is_plain else self.train


def load_corpus(config: DataConfig) -> ParallelCorpus:
    """Loads the corpus that `config` selects (explicit files > local corpora > TFDS)."""
    if any((config.train_src, config.train_tgt, config.val_src, config.val_tgt)):
        if not (config.train_src and config.train_tgt):
            raise CorpusError("--train-src and --train-tgt must be given together")
        if bool(config.val_src) != bool(config.val_tgt):
            raise CorpusError("--val-src and --val-tgt must be given together")
        val = (Path(config.val_src), Path(config.val_tgt)) if config.val_src else None
        part = _read_part(Path(config.train_src).parent.name or "local", Path(config.train_src),
                          Path(config.train_tgt), 1.0, config)
        return _local_corpus([part], val, config)
    if config.local_corpora:
        return _mixed_corpus(config.local_corpora, config)
    return _tfds_corpus(config)


def corpus_files(spec: CorpusSpec, src_lang: str = "pt", tgt_lang: str = "en") -> tuple[Path, Path, Optional[tuple]]:
    """(train src, train tgt, (validation src, tgt) or None) of one `--data` corpus.

    A directory holds `train.{src,tgt}` and optionally `validation.{src,tgt}`; any other path
    is a file-pair prefix `PATH.{src}` / `PATH.{tgt}` (training pairs only).
    """
    root = Path(spec.path)
    if root.is_dir():
        val_src, val_tgt = root / f"validation.{src_lang}", root / f"validation.{tgt_lang}"
        has_val = val_src.exists() or val_tgt.exists()
        return root / f"train.{src_lang}", root / f"train.{tgt_lang}", (val_src, val_tgt) if has_val else None
    src, tgt = Path(f"{spec.path}.{src_lang}"), Path(f"{spec.path}.{tgt_lang}")
    if not (src.exists() or tgt.exists()):
        raise CorpusError(f"--data {spec}: directory not found, and no file pair {src} / {tgt}")
    return src, tgt, None


def _mixed_corpus(specs: tuple[CorpusSpec, ...], config: DataConfig) -> ParallelCorpus:
    """Local corpora mixed by weight (transformer/data/mixing.py); validation from the first that has one."""
    parts, validation = [], None
    for spec in specs:
        train_src, train_tgt, val = corpus_files(spec, config.src_lang, config.tgt_lang)
        try:
            parts.append(_read_part(Path(spec.path).name or "local", train_src, train_tgt, spec.weight, config))
        except CorpusError as err:
            raise CorpusError(f"--data {spec}: {err}") from None
        if val is not None and validation is None:
            validation = val
            if len(specs) > 1:
                log.info("validation split: %s / %s (from --data %s)", *val, spec)
        elif val is not None:
            log.info("--data %s: its validation split is not used (validation comes from the first --data "
                     "that has one)", spec)
    return _local_corpus(parts, validation, config)


@dataclass
class _Part:
    name: str
    src: list
    tgt: list
    dropped: int
    weight: float
    fingerprint: str


def _read_part(name: str, train_src: Path, train_tgt: Path, weight: float, config: DataConfig) -> _Part:
    src, tgt, dropped = read_parallel_files(train_src, train_tgt)
    src, tgt = src[: config.max_train_examples], tgt[: config.max_train_examples]
    digest = hashlib.sha256()
    for line in src + tgt:
        digest.update(line.encode("utf-8") + b"\n")
    return _Part(name, src, tgt, dropped, weight, digest.hexdigest())


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
    if path.is_dir():
        raise CorpusError(f"{path} is a directory; expected a text file with one sentence per line")
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


def _local_corpus(parts: list[_Part], val: Optional[tuple[Path, Path]], config: DataConfig) -> ParallelCorpus:
    """The corpus of `parts`; one part of weight 1 is exactly that corpus (same fingerprint as ever)."""
    mixture = Mixture(tuple(MixturePart(p.name, tf.data.Dataset.from_tensor_slices((p.src, p.tgt)), len(p.src),
                                         p.weight) for p in parts))
    if mixture.is_plain:
        fingerprint = parts[0].fingerprint
    else:  # the data and the weights: the vocabulary is learned from the weighted mixture
        fingerprint = hashlib.sha256(json.dumps([[p.fingerprint, p.weight] for p in parts]).encode()).hexdigest()
        for part in mixture.parts:
            log.info("training corpus %s: %d pairs, weight %g → %d per epoch", part.name, part.size, part.weight,
                     part.share)
    dropped = sum(p.dropped for p in parts)
    validation, num_val = None, None
    if val is not None:
        vsrc, vtgt, vdropped = read_parallel_files(*val)
        vsrc, vtgt = vsrc[: config.max_val_examples], vtgt[: config.max_val_examples]
        dropped += vdropped
        validation, num_val = tf.data.Dataset.from_tensor_slices((vsrc, vtgt)), len(vsrc)
    if dropped:
        log.warning("dropped %d sentence pairs with an empty side", dropped)
    return ParallelCorpus(
        name="+".join(p.name for p in parts),
        fingerprint=fingerprint,
        train=mixture.epoch(seed=LEARN_SEED, reshuffle=False),
        validation=validation,
        num_train=mixture.epoch_size,
        num_validation=num_val,
        dropped_empty=dropped,
        mixture=mixture,
    )


def _tfds_corpus(config: DataConfig) -> ParallelCorpus:
    """A TFDS translation dataset through `tfds.load` (downloads and prepares it if needed).

    `tfds.load(..., as_supervised=True)` yields `(src, tgt)` pairs in the dataset's
    supervised order (pt, en for `ted_hrlr_translate/pt_to_en`). Pairs with an empty side
    are filtered out lazily, so `num_train` / `num_validation` are the split sizes (capped
    by `max_*_examples`) before that filter, and `dropped_empty` stays 0 (unknown without a
    full pass). The validation split is used when the dataset has one.
    """
    def load(split: str, **kwargs):
        return _tfds_load(config.dataset, split, config.tfds_data_dir, **kwargs)

    train, info = load("train", with_info=True)

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


def _tfds_load(dataset: str, split: str, data_dir: Optional[str], **kwargs):
    """`tfds.load(dataset, split=…, as_supervised=True)`; a failure is a CorpusError saying what to do offline."""
    import tensorflow_datasets as tfds

    try:
        return tfds.load(dataset, split=split, data_dir=data_dir, as_supervised=True, shuffle_files=False, **kwargs)
    except tfds.core.registered.DatasetNotFoundError as err:
        raise CorpusError(f"--dataset {dataset!r}: {err}") from None
    except Exception as err:  # offline, missing split: tfds raises many types
        raise CorpusError(
            f"could not load TFDS dataset {dataset!r} split {split!r} ({type(err).__name__}: {err}). "
            "Offline? Put the dataset's archives in the TFDS manual directory "
            "(<tfds-data-dir>/downloads/manual) or use local files: --data DIR "
            "(see docs/training.md)."
        ) from None


def load_split(*, src_file: Optional[str] = None, ref_file: Optional[str] = None, data_dir: Optional[str] = None,
               split: str = "test", dataset: Optional[str] = None, tfds_data_dir: Optional[str] = None,
               src_lang: str = "pt", tgt_lang: str = "en", limit: Optional[int] = None) -> tuple[list, list]:
    """(sources, references) of one split for evaluation: line-aligned files, a `{split}.{lang}`
    directory, or a TFDS dataset's split (as Python str lists, the first `limit` pairs)."""
    if src_file or ref_file:
        if not (src_file and ref_file):
            raise CorpusError("--src and --ref must be given together")
        sources, references, _ = read_parallel_files(Path(src_file), Path(ref_file))
    elif data_dir:
        root = Path(data_dir)
        sources, references, _ = read_parallel_files(root / f"{split}.{src_lang}", root / f"{split}.{tgt_lang}")
    elif dataset:
        sources, references = [], []
        for src, ref in _tfds_load(dataset, split, tfds_data_dir).as_numpy_iterator():
            sources.append(src.decode("utf-8"))
            references.append(ref.decode("utf-8"))
    else:
        raise CorpusError("choose the evaluation data: --src/--ref files, --data DIR, or --dataset NAME")
    return sources[:limit], references[:limit]


def _both_sides_non_empty(src: tf.Tensor, tgt: tf.Tensor) -> tf.Tensor:
    """True when neither scalar tf.string is empty after stripping whitespace."""
    return tf.logical_and(tf.strings.length(tf.strings.strip(src)) > 0,
                          tf.strings.length(tf.strings.strip(tgt)) > 0)
