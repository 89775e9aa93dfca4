"""SentencePiece unigram models (Kudo 2018) learned with the `sentencepiece` package.

`learn(sentences, vocab_size, lower_case)` returns the serialized model proto that
tensorflow-text's `SentencepieceTokenizer` applies (transformer/data/tokenizer.py): the
`sentencepiece` package is needed to learn a model, never to load or use one. Its ids 0-3 are
the reserved tokens of every vocabulary (`constants.RESERVED_TOKENS`: [PAD], [UNK], [START],
[END]); an unknown character decodes to "[UNK]", as WordPiece's unknown words do.

Normalisation: NFKC (SentencePiece's `nmt_nfkc`, which also folds whitespace); `lower_case`
adds case folding (`nmt_nfkc_cf`) but, unlike the WordPiece tokenizer, keeps accents.
"""

from __future__ import annotations

import io
from typing import Iterable

import sentencepiece as spm

from transformer.base.constants import END_ID, PAD_ID, RESERVED_TOKENS, START_ID, UNK_ID

WORD_BOUNDARY = "\u2581"  # "▁": SentencePiece's mark of a piece that starts a word


def learn(sentences: Iterable[str], vocab_size: int, lower_case: bool, threads: int = 2) -> bytes:
    """The serialized unigram model proto learned from `sentences` (str), about `vocab_size` pieces.

    `vocab_size` counts the reserved tokens; a corpus too small for it gives fewer pieces
    (`hard_vocab_limit=False`) instead of an error. Every character of the corpus is kept
    (`character_coverage=1.0`: Portuguese accents are part of the alphabet).
    """
    pad, unk, start, end = RESERVED_TOKENS
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, model_type="unigram", vocab_size=vocab_size,
        hard_vocab_limit=False, character_coverage=1.0,
        normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=START_ID, eos_id=END_ID,
        pad_piece=pad, unk_piece=unk, bos_piece=start, eos_piece=end, unk_surface=unk,
        num_threads=threads, minloglevel=2,
    )
    return model.getvalue()


def pieces(model_proto: bytes) -> list[str]:
    """The model's vocabulary: piece i at index i (the reserved tokens first)."""
    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
