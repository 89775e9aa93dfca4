"""Shared pieces of the decoding / translator / export tests: tiny random models and small
real WordPiece tokenizers learned once per test process from the first Bible pairs.

The corpus is read in place from `../shared/data/bible-pt-en`; tests needing it call
`shared_tokenizers()`, which skips when it is absent.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile
import unicodedata

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from helpers_model import TINY_MODEL, build  # noqa: E402

from transformer.base.config import DataConfig, TokenizerConfig  # noqa: E402
from transformer.base.constants import SHARED_CORPUS_DIR  # noqa: E402

BIBLE_DIR = SHARED_CORPUS_DIR


def tiny_model(src_vocab_size: int = 40, tgt_vocab_size: int = 48, max_length: int = 24, seed: int = 0,
               num_layers: int = 2, d_model: int = 16, head_width: str = "tutorial"):
    """`helpers_model.TINY_MODEL` built with these overrides (2 heads, dff 32, no dropout).

    head_width "tutorial" decodes with the input cache, "paper" with the key/value cache."""
    config = dataclasses.replace(TINY_MODEL, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                                 max_length=max_length, num_layers=num_layers, d_model=d_model, head_width=head_width)
    return build(config, seed)


# The test process's one tokenizer build: the first TOKENIZER_PAIRS training pairs, vocab
# ~TOKENIZER_VOCAB, lower-cased (tests check the normalisation). conftest's session fixture
# `bible_tokenizers` and `tiny_translator` both use it; training tests pass the same slice and
# root, so `train()` reuses these tokenizers (same key) instead of spending ~30 s learning new ones.
TOKENIZER_PAIRS = 1500
TOKENIZER_VOCAB = 1000
VAL_PAIRS = 50


def bible_slice_config() -> DataConfig:
    """The slice of the Bible corpus the test tokenizers are learned from."""
    return DataConfig(data_dir=str(BIBLE_DIR), max_train_examples=TOKENIZER_PAIRS, max_val_examples=VAL_PAIRS)


@functools.lru_cache(maxsize=None)
def _build_test_tokenizers(algorithm: str = "wordpiece"):
    from transformer.data.corpora import load_corpus
    from transformer.data.tokenizer import build_or_load_tokenizers

    root = tempfile.mkdtemp(prefix="test-tokenizers-")
    config = TokenizerConfig(algorithm=algorithm, vocab_size=TOKENIZER_VOCAB, root=root, lower_case=True)
    corpus = load_corpus(bible_slice_config())
    tokenizers, directory = build_or_load_tokenizers(corpus, config)
    return tokenizers, directory, config, corpus


def shared_tokenizers(algorithm: str = "wordpiece"):
    """(tokenizers, directory, TokenizerConfig, corpus), built once per test process and `algorithm`
    (wordpiece, or sentencepiece: a unigram model); skips without the corpus."""
    if not (BIBLE_DIR / "train.pt").is_file() or not (BIBLE_DIR / "train.en").is_file():
        pytest.skip(f"shared Bible corpus not found at {BIBLE_DIR} (needs train.pt / train.en)")
    return _build_test_tokenizers(algorithm)


def tiny_translator(config=None, seed: int = 0, max_length: int = 24, algorithm: str = "wordpiece",
                    num_layers: int = 2, head_width: str = "tutorial"):
    """A Translator over `shared_tokenizers(algorithm)` and a tiny random model (`tiny_model`'s
    `num_layers` and `head_width`: one layer about halves what tracing a decoder or export costs)."""
    from transformer.inference.translator import DecodeConfig, Translator

    tokenizers = shared_tokenizers(algorithm)[0]
    model = tiny_model(int(tokenizers.src.get_vocab_size()), int(tokenizers.tgt.get_vocab_size()),
                       max_length=max_length, seed=seed, num_layers=num_layers, head_width=head_width)
    return Translator(tokenizers, model, config or DecodeConfig())


def tiny_ctranslate2_export(directory, config=None, seed: int = 0):
    """(`tiny_translator(config, seed)`, the path of its CTranslate2 export under `directory`):
    CTranslate2 decodes the same weights with the same tokenizers; skips without ctranslate2."""
    pytest.importorskip("ctranslate2", reason="ctranslate2 is pinned in requirements.txt: pip install -r it")
    from transformer.inference.ctranslate2_export import export_ctranslate2

    translator = tiny_translator(config, seed=seed)
    path = export_ctranslate2(translator.model, shared_tokenizers()[1], directory / "model", config=translator.config)
    return translator, path


# Inputs that must never crash the translator: one output row each.
BAD_INPUTS = [
    "Deus criou os céus e a terra.",
    "",
    "   ",
    "\t \n ",
    "palavra " * 1250,  # 10,000 characters
    "Привет, как дела?",
    "你好，世界",
    "😀🎉👍",
    b"invalid \xff\xfe utf-8 \xc3",
    "a",
    # over the tiny models' 22 tokens: cut into its sentences and clauses, their translations joined
    "No princípio criou Deus os céus e a terra. A terra era sem forma e vazia; havia trevas sobre a face do "
    "abismo, e o Espírito de Deus pairava sobre as águas. Disse Deus: Haja luz. E houve luz 3.5 vezes! ",
]

# Lines written in capitals (transformer/inference/casing.py): translated as `fold_reference` folds them,
# the translation in capitals; the second is over the tiny models' 22 tokens, so its pieces are joined,
# then upper-cased.
SHOUTED_INPUTS = [
    "DEUS É AMOR E LUZ.",
    "NO PRINCÍPIO CRIOU DEUS OS CÉUS E A TERRA. A TERRA ERA SEM FORMA E VAZIA; HAVIA TREVAS SOBRE A FACE DO "
    "ABISMO, E O ESPÍRITO DE DEUS PAIRAVA SOBRE AS ÁGUAS.",
]
# Lines with a run of words in capitals: the run folded, the translation not upper-cased.
SPAN_INPUTS = [
    "Ele disse: NÃO FAÇAS ISSO AGORA.",
    "E Deus disse a Moisés: EU SOU O QUE SOU. Assim dirás aos filhos de Israel.",
]
CAPITALS_INPUTS = SHOUTED_INPUTS + SPAN_INPUTS

# casing.fold written again in plain Python, rule by rule, for the tests to hold the graph to.
# RE2's \s is ASCII white space; \p{Ll} / \p{Lu} / \pL are Unicode categories.
_WHITE_SPACE = re.compile(r"([\t\n\f\r ]+)")
_SENTENCE_END = re.compile(r".*[.!?…][\"'”’»)\]]*", re.DOTALL)


def fold_reference(line: str) -> str:
    """The line with every run of words in capitals lower-cased, sentence starts keeping their first letter."""
    def lower_case(word):
        return any(unicodedata.category(c) == "Ll" for c in word)

    def in_capitals(word):
        return not lower_case(word) and any(unicodedata.category(a) == unicodedata.category(b) == "Lu"
                                            for a, b in zip(word, word[1:]))

    parts = _WHITE_SPACE.split(line)  # words at even places, the white space between at odd ones
    runs, run = [], []  # runs of places of words without a lower-case letter
    for place in range(0, len(parts), 2):
        if lower_case(parts[place]):
            runs.append(run)
            run = []
        else:
            run.append(place)
    runs.append(run)
    for run in runs:
        if sum(in_capitals(parts[place]) for place in run) < 2:
            continue
        for place in run:
            word = parts[place]
            letters = [c for c in word if unicodedata.category(c).startswith("L")]
            if len(letters) == 1 and "A" <= letters[0] <= "Z" and letters[0] + "." in word:
                continue  # an initial (A–Z and a period), kept as typed
            letter = next((i for i, c in enumerate(word) if unicodedata.category(c).startswith("L")), None)
            starts = place == 0 or parts[place - 2] == "" or _SENTENCE_END.fullmatch(parts[place - 2])
            parts[place] = word[:letter + 1] + word[letter + 1:].lower() if starts and letter is not None else word.lower()
    return "".join(parts)


class ScriptedTranslator:
    """Returns the reference itself or rubbish, following a script of good/bad evaluations."""

    def __init__(self, references, script):
        self.references, self.script = references, list(script)

    def translate(self, sources):
        good = self.script.pop(0)
        return list(self.references) if good else ["zzz"] * len(sources)
