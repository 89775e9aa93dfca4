"""Subword tokenizers (tensorflow-text), learned from the training split, saved as one
SavedModel holding both languages: WordPiece (the default) or a SentencePiece unigram model
(`--tokenizer sentencepiece`), which can also sample segmentations (subword regularisation).

Layout of a built tokenizer directory `tokenizers/<key>/`:
    saved_model.pb, variables/, assets/      the `PairTokenizers` module
    src_vocab.txt, tgt_vocab.txt             the vocabularies, readable (WordPiece: its assets)
    src.model, tgt.model                     SentencePiece only: the unigram model protos
    manifest.json                            what it was built from (`algorithm`: which kind)

The key is derived from the data fingerprint and the vocab parameters, so the same inputs
reuse a directory and different inputs never collide. Directories are built in a temporary
sibling and renamed into place, so a crash never leaves a half-built tokenizer.

Both kinds have the same ids for the reserved tokens ([PAD] 0, [UNK] 1, [START] 2, [END] 3)
and the same interface and contract (`LanguageTokenizer`). Loading needs `import
tensorflow_text` before `tf.saved_model.load` (the ops, e.g. CaseFoldUTF8 or
SentencepieceOp, are registered by that import); `load_tokenizers` does it. The
`sentencepiece` package is needed only to learn a unigram model (transformer/data/unigram.py).
"""

from __future__ import annotations

import copy
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
from transformer.base.constants import END_ID, PAD_ID, RESERVED_TOKENS, START_ID
from transformer.base.errors import InputError
from transformer.data import unigram, wordpiece
from transformer.data.corpora import ParallelCorpus
from transformer.runtime.artifacts import load_saved_model
from transformer.runtime.tfdata import with_pipeline_options

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
# How WordPiece words are spaced on detokenizing (`_join_words`), saved in manifest.json as
# `join_rules` (absent: 1). 2: quotes open or close by their context, hyphens join words.
# 3: numbers keep their separators and signs (`1,500`, `3.5`, `3:16`, `$5`, `50%`).
JOIN_RULES = 3
_REQUIRED_FILES = ("saved_model.pb", "variables", "manifest.json", "src_vocab.txt", "tgt_vocab.txt")


class TokenizerError(InputError, ValueError):
    """A tokenizer directory is missing, incomplete or inconsistent."""

    hint = ("rebuild them: python scripts/build_tokenizers.py --data <corpus> with the run's --tokenizer/--vocab-size/--cased "
            "flags, then copy the directory it prints over this one (scripts/train.py builds missing ones)")


def _bert_params(lower_case: bool) -> dict:
    # lower_case=True also strips accents (NFD + drop combining marks), as in the tutorial.
    return dict(lower_case=True) if lower_case else dict(lower_case=False, normalization_form="NFC")


_OPEN_DOUBLE, _OPEN_SINGLE = "\x01", "\x02"  # opening quotes while spaces are decided (control characters: never in a word)
_OPEN = _OPEN_DOUBLE + _OPEN_SINGLE


def _join_words(text: tf.Tensor, lower_case: bool = False) -> tf.Tensor:
    """[batch] tf.string of space-separated words (punctuation a word of its own) → [batch]
    sentences with natural punctuation spacing (the rules of `JOIN_RULES`).

    Contractions join both sides (`Lord ' s` → `Lord's`; `fathers ' houses` → `fathers'
    houses`); a hyphen between letters or digits joins them, and so do a `.` or `:` between
    digits, a `,` before three of them (`1,500`, `3.5`, `3:16`; `1, 2, 3` stays), `$` the
    number after and `%` the number before; `.,;:!?)]}` and a closing quote
    join the word before, `([{` and an opening quote the word after. A quote (`"` or `'`) is
    opening at the line's start, after another opening one, after `,` `:` `(` when a capital
    or a quote follows (`said, " Let` → `said, "Let`), or after a word when a capital
    follows; else closing (`light, " and` → `light," and`). Lower-cased text has no capitals:
    there any letter follows an opening quote, and an opening quote before the last one of its
    kind has closed closes it. On the English references of the shared corpus this gives back
    98.8% of the training lines exactly (with a quote: 97.0%; lower-cased 98.1%, 95.1%; the
    rules before: 67.9%, 15.2%), docs/training.md#detokenizing.
    """
    replace = tf.strings.regex_replace
    capital = r"[\pL\pN]" if lower_case else r"\p{Lu}"
    opening_contexts = (rf"([,:({_OPEN}]) QUOTE ({capital}|[\"'{_OPEN}])",  # `said , " Let`, `" ' Will`
                        r"([\pL\pN]) QUOTE (\p{Lu})")  # `named it " Heaven`
    text = replace(text, r"(\pL) ' (s|t|d|m|ll|re|ve)\b", r"\1'\2")
    for _ in range(2):  # again for what a match consumed, and for a quote after an opening one
        for quote, opening in (('"', _OPEN_DOUBLE), ("'", _OPEN_SINGLE)):
            text = replace(text, f"^{quote}( |$)", rf"{opening}\1")
            for context in opening_contexts:
                text = replace(text, context.replace("QUOTE", quote), rf"\1 {opening} \2")
    if lower_case:  # an opening quote before its kind has closed closes it: `, " let … light , " and`
        for quote, opening in (('"', _OPEN_DOUBLE), ("'", _OPEN_SINGLE)):
            text = replace(text, f"({opening}[^{quote}{opening}]*){opening}", rf"\1{quote}")
    text = replace(text, r" ([.,;:!?)\]}\"'])", r"\1")  # `. ' "` → `.'"`
    text = replace(text, rf"([(\[{{{_OPEN}]) ", r"\1")
    text = replace(replace(text, _OPEN_DOUBLE, '"'), _OPEN_SINGLE, "'")
    for _ in range(2):  # a match consumes the next word's first character: `a - b - c` needs two passes
        text = replace(text, r"([\pL\pN]) - ([\pL\pN])", r"\1-\2")
        text = replace(text, r"(\pN)([.:]) (\pN)", r"\1\2\3")  # `3. 5` → `3.5`, `3: 16` → `3:16`
        text = replace(text, r"(\pN), (\pN\pN\pN)(\PN|$)", r"\1,\2\3")  # `1, 500, 000` → `1,500,000`
    text = replace(text, r"\$ (\pN)", r"$\1")
    return replace(text, r"(\pN) %", r"\1%")


def _wordpiece_text(lookup, token_ids, lower_case: bool) -> tf.Tensor:
    """WordPiece ids → text: [batch, tokens] int64 ids (dense or ragged) → [batch] tf.string.

    [PAD], [START] and [END] are dropped ([UNK] stays), `lookup` (ids → pieces) gives the
    pieces, a "##" piece joins the one before, and `_join_words` spaces the words (of a
    lower-cased vocabulary when `lower_case`).
    """
    if not isinstance(token_ids, tf.RaggedTensor):
        token_ids = tf.RaggedTensor.from_tensor(token_ids)
    reserved = (token_ids == PAD_ID) | (token_ids == START_ID) | (token_ids == END_ID)
    pieces = lookup(tf.ragged.boolean_mask(token_ids, ~reserved))
    words = tf.strings.regex_replace(tf.strings.reduce_join(pieces, separator=" ", axis=-1), " ##", "")
    return _join_words(words, lower_case)


class LanguageTokenizer(tf.Module):
    """One language's tokenizer with [START]/[END] handling; subclasses segment (`_segment`) and join (`_text`).

    tokenize: [batch] tf.string → RaggedTensor [batch, (tokens)] int64, with [START] … [END]
      (deterministic).
    detokenize: [batch, tokens] int ids (dense or ragged) → [batch] tf.string; reserved
      tokens (PAD/START/END) are dropped, text after the first [END] is ignored by callers.
    lookup: ids → their pieces (tf.string); get_vocab_size, get_reserved_tokens.
    """

    def __init__(self, vocab: list[str]):
        super().__init__()
        self.vocab = tf.Variable(vocab, trainable=False, name="vocab")
        self._reserved = tf.constant(list(RESERVED_TOKENS))

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        if save_type == "savedmodel":  # inside `tf.saved_model.save`'s own context
            self._trace()
        return super()._trackable_children(save_type, **kwargs)

    def _trace(self) -> None:
        """Concrete functions of every method, so the SavedModel has them.

        Traced when a SavedModel is written (`_trackable_children`), not when the tokenizer is
        made: `tf.saved_model.save` traces in a context of its own (its variable policy is part
        of the function cache key), so functions traced before were traced twice. The specs
        carry the arguments' names, as the save's own re-tracing of each signature does (a
        name is part of a spec's cache key): each method is traced once. In a process that uses
        the tokenizer without saving it, each method is traced at its first call.
        """
        self.tokenize.get_concrete_function(tf.TensorSpec([None], tf.string, name="strings"))
        self.detokenize.get_concrete_function(tf.TensorSpec([None, None], tf.int64, name="token_ids"))
        self.detokenize.get_concrete_function(tf.RaggedTensorSpec([None, None], tf.int64))
        self.lookup.get_concrete_function(tf.TensorSpec([None, None], tf.int64, name="token_ids"))
        self.lookup.get_concrete_function(tf.RaggedTensorSpec([None, None], tf.int64))
        self.get_vocab_size.get_concrete_function()
        self.get_reserved_tokens.get_concrete_function()

    @staticmethod
    def _with_start_end(ids: tf.RaggedTensor) -> tf.RaggedTensor:
        """[batch, (tokens)] int64 → [batch, (tokens + 2)]: [START] ids [END]."""
        batch = ids.bounding_shape()[0]
        starts = tf.fill([batch, 1], tf.constant(START_ID, tf.int64))
        ends = tf.fill([batch, 1], tf.constant(END_ID, tf.int64))
        return tf.concat([starts, ids, ends], axis=1)

    @tf.function
    def tokenize(self, strings):
        return self._with_start_end(self._segment(strings))

    @tf.function
    def detokenize(self, token_ids):
        return self._text(token_ids)

    @tf.function
    def lookup(self, token_ids):
        return tf.gather(self.vocab, token_ids)

    @tf.function
    def get_vocab_size(self):
        return tf.shape(self.vocab)[0]

    @tf.function
    def get_reserved_tokens(self):
        return self._reserved


class WordPieceTokenizer(LanguageTokenizer):
    """WordPiece: words split on whitespace and punctuation (BERT's rules), then into the longest
    vocabulary pieces; detokenize rejoins pieces into words and spaces them (`_wordpiece_text`).

    Segmentation is tensorflow-text's `FastBertTokenizer` after `BertTokenizer`'s own
    normalisation (`_normalize`): the ids `BertTokenizer` gives on every line of the shared
    corpora, several times faster (docs/training.md, Tokenizers). Where they differ: a Unicode
    space other than ASCII's (no-break, ideographic, line separator) separates words here;
    `BertTokenizer` made the words it joins one [UNK].
    """

    def __init__(self, vocab_path: str, lower_case: bool):
        vocab = Path(vocab_path).read_text(encoding="utf-8").splitlines()
        super().__init__(vocab)
        self._vocab_asset = tf.saved_model.Asset(vocab_path)
        self.lower_case = lower_case
        self._words = bert_vocab.bert_tokenizer.BasicTokenizer(**_bert_params(lower_case))  # its lower_case()
        self.segmenter = tf_text.FastBertTokenizer(vocab, token_out_type=tf.int64, unknown_token=RESERVED_TOKENS[1])

    def _normalize(self, strings):
        """`BertTokenizer`'s normalisation: NFC (cased) or case folding, NFD and accents
        stripped (lower_case); control and format characters become spaces."""
        if self.lower_case:
            strings = self._words.lower_case(strings)
        else:
            strings = tf_text.normalize_utf8(strings, "NFC")
        return tf.strings.regex_replace(strings, r"\p{Cc}|\p{Cf}", " ")

    def _segment(self, strings):
        return self.segmenter.tokenize(self._normalize(strings))  # [batch, (tokens)]

    def _text(self, token_ids):
        return _wordpiece_text(lambda ids: tf.gather(self.vocab, ids), token_ids, self.lower_case)


class SentencePieceTokenizer(LanguageTokenizer):
    """A SentencePiece unigram model (tensorflow-text `SentencepieceTokenizer`; the proto is
    stored in the SavedModel). Pieces carry their spaces ("▁"), so detokenize gives back the
    normalised text; [PAD]/[START]/[END] are control pieces and decode to nothing.

    tokenize_sampled(strings, nbest, alpha): like tokenize, with each sentence's segmentation
      sampled (Kudo 2018) among its `nbest` best (int32 scalar; -1: all) with inverse
      temperature `alpha` (float32 scalar > 0): a different one on each call, for training.
    """

    def __init__(self, model_path: str):
        proto = Path(model_path).read_bytes()
        # A name per model: restored from a SavedModel, unnamed SentencepieceTokenizers all get the
        # model of the first one (tensorflow-text 2.21; tests/data/test_sentencepiece.py checks both sides).
        name = f"sentencepiece_{hashlib.sha256(proto).hexdigest()[:12]}"
        self.tokenizer = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32, name=name)
        super().__init__([piece.decode() for piece in self.tokenizer.id_to_string(
            tf.range(self.tokenizer.vocab_size())).numpy()])

    def _trace(self) -> None:
        super()._trace()
        self.tokenize_sampled.get_concrete_function(tf.TensorSpec([None], tf.string, name="strings"),
                                                    tf.TensorSpec([], tf.int32, name="nbest"),
                                                    tf.TensorSpec([], tf.float32, name="alpha"))

    def _segment(self, strings):
        return tf.cast(self.tokenizer.tokenize(strings), tf.int64)

    def _text(self, token_ids):
        return self.tokenizer.detokenize(tf.cast(token_ids, tf.int32))

    @tf.function
    def tokenize_sampled(self, strings, nbest, alpha):
        sampler = copy.copy(self.tokenizer)  # the same model resource; the op reads these two per call
        sampler.nbest_size, sampler.alpha = nbest, alpha
        return self._with_start_end(tf.cast(sampler.tokenize(strings), tf.int64))


class PairTokenizers(tf.Module):
    """The source (`src`) and target (`tgt`) tokenizers, saved together.

    `src_path` / `tgt_path`: vocabulary files (WordPiece) or model protos (SentencePiece).
    """

    def __init__(self, src_path: str, tgt_path: str, lower_case: bool, algorithm: str = "wordpiece"):
        super().__init__()
        if algorithm == "sentencepiece":  # the model proto holds its normalisation (lower_case included)
            self.src, self.tgt = SentencePieceTokenizer(src_path), SentencePieceTokenizer(tgt_path)
        else:
            self.src, self.tgt = WordPieceTokenizer(src_path, lower_case), WordPieceTokenizer(tgt_path, lower_case)


class RejoinedWordPiece(LanguageTokenizer):
    """A WordPiece tokenizer loaded from a SavedModel that spaces words by older rules (its
    manifest's `join_rules` below `JOIN_RULES`): ids from the loaded graph (the ids its run
    was trained on), text by today's `_wordpiece_text`. Saved inside an export like any
    `LanguageTokenizer`."""

    def __init__(self, loaded, lower_case: bool):
        size = loaded.get_vocab_size()
        super().__init__([piece.decode() for piece in loaded.lookup(tf.range(size, dtype=tf.int64)[tf.newaxis])[0].numpy()])
        self.loaded, self.lower_case = loaded, lower_case

    def _segment(self, strings):
        return self.loaded.tokenize(strings)[:, 1:-1]  # [START]/[END] are added back by `tokenize`

    _text = WordPieceTokenizer._text  # its vocabulary and case, today's rules


class RejoinedPair(tf.Module):
    """`PairTokenizers` of a loaded SavedModel with both sides `RejoinedWordPiece`."""

    def __init__(self, loaded, lower_case: bool):
        super().__init__()
        self.src, self.tgt = RejoinedWordPiece(loaded.src, lower_case), RejoinedWordPiece(loaded.tgt, lower_case)


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
            # Only when set, so the keys (and directories) of WordPiece / per-language vocabularies stay as they were.
            **({"shared_vocab": True} if config.shared_vocab else {}),
            **({"algorithm": config.algorithm} if config.algorithm != "wordpiece" else {}),
        ),
        sort_keys=True,
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:10]
    case = "lower" if config.lower_case else "cased"
    shared = "-shared" if config.shared_vocab else ""
    kind = "sp" if config.algorithm == "sentencepiece" else "wp"
    return f"{corpus.name}-{kind}{config.vocab_size}{shared}-{case}-{digest}"


def learn_vocab(sentences: tf.data.Dataset, config: TokenizerConfig) -> list[str]:
    """Learns a WordPiece vocabulary from a dataset of scalar tf.string sentences.

    tensorflow-text's `bert_vocab_from_dataset` step by step (its BasicTokenizer word split
    and `count_words`), with the learner of `transformer.data.wordpiece`: the same vocabulary, faster.
    """
    if config.learn_max_examples:
        sentences = sentences.take(config.learn_max_examples)
    words = bert_vocab.bert_tokenizer.BasicTokenizer(**_bert_params(config.lower_case))
    counts = bert_vocab.learner.count_words(with_pipeline_options(sentences.batch(1000).prefetch(2)
                                                                  .map(words.tokenize)))
    return wordpiece.learn(counts, config.vocab_size, list(RESERVED_TOKENS))


def learn_unigram(sentences: tf.data.Dataset, config: TokenizerConfig) -> bytes:
    """Learns a SentencePiece unigram model (serialized proto) from a dataset of scalar tf.string sentences."""
    if config.learn_max_examples:
        sentences = sentences.take(config.learn_max_examples)
    text = (sentence.decode("utf-8", errors="replace")
            for sentence in with_pipeline_options(sentences).as_numpy_iterator())
    return unigram.learn(text, config.vocab_size, config.lower_case)


def build_or_load_tokenizers(corpus: ParallelCorpus, config: TokenizerConfig) -> tuple[PairTokenizers, Path]:
    """Returns (tokenizers, directory), building them only if the keyed directory is absent."""
    directory = Path(config.root) / tokenizer_key(corpus, config)
    if directory.exists():
        log.info("reusing tokenizers in %s", directory)
        return load_tokenizers(directory), directory
    start = time.perf_counter()
    learn = learn_unigram if config.algorithm == "sentencepiece" else learn_vocab
    if config.shared_vocab:  # one vocabulary learned on both sides, saved as both (same ids)
        both = corpus.train.flat_map(lambda s, t: tf.data.Dataset.from_tensor_slices(tf.stack([s, t])))
        src_model = tgt_model = learn(both, config)
    else:
        src_model = learn(corpus.train.map(lambda s, t: s), config)
        tgt_model = learn(corpus.train.map(lambda s, t: t), config)
    save_tokenizers(directory, src_model, tgt_model, config, corpus)
    tokenizers = load_tokenizers(directory)
    log.info(
        "built %s tokenizers in %.1f s: %s (src vocab %d, tgt vocab %d)", config.algorithm,
        time.perf_counter() - start, directory, int(tokenizers.src.get_vocab_size()),
        int(tokenizers.tgt.get_vocab_size()),
    )
    return tokenizers, directory


def save_tokenizers(
    directory: Path, src_model: list[str] | bytes, tgt_model: list[str] | bytes, config: TokenizerConfig,
    corpus: Optional[ParallelCorpus] = None,
) -> None:
    """Writes vocab files (and model protos), the SavedModel and manifest.json atomically to `directory`.

    `src_model` / `tgt_model`: WordPiece vocabularies (token lists), or SentencePiece model protos
    (bytes) when `config.algorithm` is "sentencepiece".
    """
    with atomic.staged_directory(directory, keep_existing=True) as staging:  # built concurrently: keep theirs
        if config.algorithm == "sentencepiece":
            for lang, proto in (("src", src_model), ("tgt", tgt_model)):
                (staging / f"{lang}.model").write_bytes(proto)
            module = PairTokenizers(str(staging / "src.model"), str(staging / "tgt.model"), config.lower_case,
                                    config.algorithm)
            src_vocab, tgt_vocab = ([p.decode() for p in side.vocab.numpy()] for side in (module.src, module.tgt))
        else:
            src_vocab, tgt_vocab = src_model, tgt_model
        for name, vocab in (("src_vocab.txt", src_vocab), ("tgt_vocab.txt", tgt_vocab)):
            (staging / name).write_text("\n".join(vocab) + "\n", encoding="utf-8")
        if config.algorithm != "sentencepiece":
            module = PairTokenizers(str(staging / "src_vocab.txt"), str(staging / "tgt_vocab.txt"), config.lower_case)
        tf.saved_model.save(module, str(staging))
        manifest = dict(
            format=FORMAT_VERSION,
            algorithm=config.algorithm,
            join_rules=JOIN_RULES,
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
    """Loads a tokenizer SavedModel, validating the directory first. A WordPiece one saved with
    older spacing rules comes wrapped (`RejoinedPair`): the same ids, today's spacing.

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
    loaded = load_saved_model(directory, f"tokenizer SavedModel {directory}", TokenizerError.hint, TokenizerError)
    if manifest.get("algorithm", "wordpiece") == "wordpiece" and manifest.get("join_rules", 1) < JOIN_RULES:
        return RejoinedPair(loaded, bool(manifest.get("lower_case")))  # the same ids, today's spacing
    return loaded
