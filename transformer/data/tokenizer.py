"""WordPiece tokenizers (tensorflow-text), learned from the training split, saved as one
SavedModel holding both languages.

Layout of a built tokenizer directory `tokenizers/<key>/`:
    saved_model.pb, variables/, assets/{src,tgt}_vocab.txt   the `PairTokenizers` module
    src_vocab.txt, tgt_vocab.txt                             the same vocabularies, readable
    manifest.json                                            what it was built from

The key is derived from the data fingerprint and the vocab parameters, so the same inputs
reuse a directory and different inputs never collide. Directories are built in a temporary
sibling and renamed into place, so a crash never leaves a half-built tokenizer.

Loading needs `import tensorflow_text` before `tf.saved_model.load` (the ops, e.g.
CaseFoldUTF8, are registered by that import); `load_tokenizers` does it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Optional

import tensorflow as tf
import tensorflow_text as tf_text  # noqa: F401  (registers the ops the SavedModel needs)
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab

from transformer.base import atomic
from transformer.base.config import TokenizerConfig
from transformer.base.constants import END_ID, RESERVED_TOKENS, START_ID
from transformer.base.errors import InputError
from transformer.data import wordpiece
from transformer.data.corpora import ParallelCorpus
from transformer.runtime.artifacts import load_saved_model

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_REQUIRED_FILES = ("saved_model.pb", "variables", "manifest.json", "src_vocab.txt", "tgt_vocab.txt")


class TokenizerError(InputError, ValueError):
    """A tokenizer directory is missing, incomplete or inconsistent."""

    hint = ("rebuild them: python scripts/build_tokenizers.py --data <corpus> with the run's --vocab-size/--cased "
            "flags, then copy the directory it prints over this one (scripts/train.py builds missing ones)")


def _bert_params(lower_case: bool) -> dict:
    # lower_case=True also strips accents (NFD + drop combining marks), as in the tutorial.
    return dict(lower_case=True) if lower_case else dict(lower_case=False, normalization_form="NFC")


def _join_wordpieces(words: tf.RaggedTensor) -> tf.Tensor:
    """[batch, (words)] tf.string → [batch] sentences with natural punctuation spacing."""
    text = tf.strings.reduce_join(words, separator=" ", axis=-1)
    text = tf.strings.regex_replace(text, r" ([.,;:!?)\]}])", r"\1")
    text = tf.strings.regex_replace(text, r"([(\[{]) ", r"\1")
    text = tf.strings.regex_replace(text, r"(\w) ' (\w)", r"\1'\2")
    return text


class LanguageTokenizer(tf.Module):
    """One language's WordPiece tokenizer with [START]/[END] handling.

    tokenize: [batch] tf.string → RaggedTensor [batch, (tokens)] int64, with [START] … [END].
    detokenize: [batch, tokens] int ids (dense or ragged) → [batch] tf.string; reserved
      tokens (PAD/START/END) are dropped, text after the first [END] is ignored by callers.
    """

    def __init__(self, vocab_path: str, lower_case: bool):
        super().__init__()
        self._vocab_asset = tf.saved_model.Asset(vocab_path)
        self.tokenizer = tf_text.BertTokenizer(vocab_path, **_bert_params(lower_case))
        vocab = Path(vocab_path).read_text(encoding="utf-8").splitlines()
        self.vocab = tf.Variable(vocab, trainable=False, name="vocab")
        self._reserved = tf.constant(list(RESERVED_TOKENS))

        self.tokenize.get_concrete_function(tf.TensorSpec([None], tf.string))
        self.detokenize.get_concrete_function(tf.TensorSpec([None, None], tf.int64))
        self.detokenize.get_concrete_function(tf.RaggedTensorSpec([None, None], tf.int64))
        self.lookup.get_concrete_function(tf.TensorSpec([None, None], tf.int64))
        self.lookup.get_concrete_function(tf.RaggedTensorSpec([None, None], tf.int64))
        self.get_vocab_size.get_concrete_function()
        self.get_reserved_tokens.get_concrete_function()

    @tf.function
    def tokenize(self, strings):
        ids = self.tokenizer.tokenize(strings).merge_dims(-2, -1)  # [batch, (tokens)]
        batch = ids.bounding_shape()[0]
        starts = tf.fill([batch, 1], tf.constant(START_ID, tf.int64))
        ends = tf.fill([batch, 1], tf.constant(END_ID, tf.int64))
        return tf.concat([starts, ids, ends], axis=1)

    @tf.function
    def detokenize(self, token_ids):
        words = self.tokenizer.detokenize(token_ids)  # [batch, (words)]
        drop = tf.reduce_any(tf.equal(words[..., tf.newaxis], self._reserved[:1]), -1)
        drop |= tf.reduce_any(tf.equal(words[..., tf.newaxis], self._reserved[2:]), -1)
        return _join_wordpieces(tf.ragged.boolean_mask(words, ~drop))

    @tf.function
    def lookup(self, token_ids):
        return tf.gather(self.vocab, token_ids)

    @tf.function
    def get_vocab_size(self):
        return tf.shape(self.vocab)[0]

    @tf.function
    def get_reserved_tokens(self):
        return self._reserved


class PairTokenizers(tf.Module):
    """The source (`src`) and target (`tgt`) tokenizers, saved together."""

    def __init__(self, src_vocab_path: str, tgt_vocab_path: str, lower_case: bool):
        super().__init__()
        self.src = LanguageTokenizer(src_vocab_path, lower_case)
        self.tgt = LanguageTokenizer(tgt_vocab_path, lower_case)


def tokenizer_key(corpus: ParallelCorpus, config: TokenizerConfig) -> str:
    """Directory name: readable prefix + hash of everything that determines the vocab."""
    identity = json.dumps(
        dict(
            fingerprint=corpus.fingerprint,
            vocab_size=config.vocab_size,
            lower_case=config.lower_case,
            learn_max_examples=config.learn_max_examples,
            reserved=RESERVED_TOKENS,
            format=FORMAT_VERSION,
            # Only when set, so the keys (and directories) of per-language vocabularies stay as they were.
            **({"shared_vocab": True} if config.shared_vocab else {}),
        ),
        sort_keys=True,
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    case = "lower" if config.lower_case else "cased"
    shared = "-shared" if config.shared_vocab else ""
    return f"{corpus.name}-wp{config.vocab_size}{shared}-{case}-{digest}"


def learn_vocab(sentences: tf.data.Dataset, config: TokenizerConfig) -> list[str]:
    """Learns a WordPiece vocabulary from a dataset of scalar tf.string sentences.

    tensorflow-text's `bert_vocab_from_dataset` step by step (its BasicTokenizer word split
    and `count_words`), with the learner of `transformer.data.wordpiece`: the same vocabulary, faster.
    """
    if config.learn_max_examples:
        sentences = sentences.take(config.learn_max_examples)
    words = bert_vocab.bert_tokenizer.BasicTokenizer(**_bert_params(config.lower_case))
    counts = bert_vocab.learner.count_words(sentences.batch(1000).prefetch(2).map(words.tokenize))
    return wordpiece.learn(counts, config.vocab_size, list(RESERVED_TOKENS))


def build_or_load_tokenizers(corpus: ParallelCorpus, config: TokenizerConfig) -> tuple[PairTokenizers, Path]:
    """Returns (tokenizers, directory), building them only if the keyed directory is absent."""
    directory = Path(config.root) / tokenizer_key(corpus, config)
    if directory.exists():
        log.info("reusing tokenizers in %s", directory)
        return load_tokenizers(directory), directory
    start = time.perf_counter()
    if config.shared_vocab:  # one vocabulary learned on both sides, saved as both (same ids)
        both = corpus.train.flat_map(lambda s, t: tf.data.Dataset.from_tensor_slices(tf.stack([s, t])))
        src_vocab = tgt_vocab = learn_vocab(both, config)
    else:
        src_vocab = learn_vocab(corpus.train.map(lambda s, t: s), config)
        tgt_vocab = learn_vocab(corpus.train.map(lambda s, t: t), config)
    save_tokenizers(directory, src_vocab, tgt_vocab, config, corpus)
    log.info(
        "built tokenizers in %.1f s: %s (src vocab %d, tgt vocab %d)",
        time.perf_counter() - start, directory, len(src_vocab), len(tgt_vocab),
    )
    return load_tokenizers(directory), directory


def save_tokenizers(
    directory: Path, src_vocab: list[str], tgt_vocab: list[str], config: TokenizerConfig,
    corpus: Optional[ParallelCorpus] = None,
) -> None:
    """Writes vocab files, the SavedModel and manifest.json atomically to `directory`."""
    with atomic.staged_directory(directory, keep_existing=True) as staging:  # built concurrently: keep theirs
        for name, vocab in (("src_vocab.txt", src_vocab), ("tgt_vocab.txt", tgt_vocab)):
            (staging / name).write_text("\n".join(vocab) + "\n", encoding="utf-8")
        module = PairTokenizers(str(staging / "src_vocab.txt"), str(staging / "tgt_vocab.txt"), config.lower_case)
        tf.saved_model.save(module, str(staging))
        manifest = dict(
            format=FORMAT_VERSION,
            reserved_tokens=list(RESERVED_TOKENS),
            lower_case=config.lower_case,
            vocab_size_requested=config.vocab_size,
            shared_vocab=config.shared_vocab,
            src_vocab_size=len(src_vocab),
            tgt_vocab_size=len(tgt_vocab),
            corpus=None if corpus is None else dict(name=corpus.name, fingerprint=corpus.fingerprint),
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            tensorflow=tf.__version__,
            tensorflow_text=tf_text.__version__,
        )
        atomic.write_json(staging / "manifest.json", manifest)


def load_tokenizers(directory: str | Path):
    """Loads a tokenizer SavedModel, validating the directory first.

    Returns the restored module with `.src` and `.tgt` (tokenize/detokenize/lookup/
    get_vocab_size/get_reserved_tokens).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise TokenizerError(
            f"tokenizer directory not found: {directory} "
            "(build it with scripts/build_tokenizers.py or let scripts/train.py build it)"
        )
    missing = [name for name in _REQUIRED_FILES if not (directory / name).exists()]
    if missing:
        raise TokenizerError(
            f"tokenizer directory {directory} is incomplete: missing {', '.join(missing)}; "
            "delete it and rebuild with scripts/build_tokenizers.py"
        )
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (ValueError, OSError) as err:
        raise TokenizerError(f"{directory}/manifest.json is damaged ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        found = manifest.get("format") if isinstance(manifest, dict) else manifest
        raise TokenizerError(f"{directory}/manifest.json: format {found} != {FORMAT_VERSION}; rebuild it")
    return load_saved_model(directory, f"tokenizer SavedModel {directory}", TokenizerError.hint, TokenizerError)
