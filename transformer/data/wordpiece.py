"""WordPiece vocabulary learning: tensorflow-text's algorithm, with its threshold-independent work done once.

`learn(word_counts, vocab_size, reserved_tokens)` returns exactly the vocabulary of
`tensorflow_text.tools.wordpiece_vocab.wordpiece_tokenizer_learner_lib.learn` (the learner
`bert_vocab_from_dataset` calls, pure Python), faster. The library binary-searches a count
threshold, and for every candidate threshold runs `learn_with_thresh`: 4 passes over the
words, the first of which counts *every* substring of every word and then subtracts
prefix counts. That first pass does not depend on the threshold (only which of its counts
are kept does), so it is computed once here and filtered per threshold. And each pass
counts only the piece from each split point to the end of the word, which gives the counts
the library is left with after its prefix subtraction (see `_piece_counts`), instead of all
O(length²) substrings. Everything else (word filtering, the search bounds, split indices,
the final ordering) calls the library's own functions.
tests/data/test_tokenizer.py checks the result against the library's `learn`.
"""

from __future__ import annotations

from typing import Optional

from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as lib


def _piece_counts(word_counts, starts_of, params) -> list[dict]:
    """Per length, the summed counts of the pieces `word[start:]` (joined when start > 0) that
    begin at one of a word's starts, i.e. the counts the library keeps after subtracting.

    The library counts every substring `word[start:end]` from each start and then, longest
    first, subtracts each token's count from all its prefixes of the same kind (joined or
    not). A substring that is a proper prefix of the piece `word[start:]` loses exactly the
    counts of the longer substrings it prefixes, so by induction from the longest: what is
    left of a token's count is the count of the pieces *equal* to it (0 for proper prefixes,
    which a threshold ≥ 1 drops). Counting those pieces directly gives the same numbers
    without the O(length²) substrings per word.
    """
    joiner, with_joiner = params.joiner, params.include_joiner_token
    pieces = [dict() for _ in range(params.max_token_length + 1)]
    for word, count in word_counts:
        for start in starts_of(word):
            piece = word[start:]
            counts = pieces[len(piece)]
            if with_joiner and start > 0:
                piece = joiner + piece
            counts[piece] = counts.get(piece, 0) + count
    return pieces


def _kept(pieces: list[dict], thresh: int) -> dict:
    """The library's `next_tokens`: counts ≥ thresh, longest first (a later length overwrites)."""
    tokens = {}
    for length in range(len(pieces) - 1, 0, -1):
        for token, count in pieces[length].items():
            if count >= thresh:
                tokens[token] = count
    return tokens


class _Learner:
    """`learn_with_thresh` of the library for one word list, with the first pass computed once."""

    def __init__(self, word_counts, params):
        self.word_counts, self.params = word_counts, params
        self.char_tokens = lib.extract_char_tokens(word_counts)
        self.first_pass = _piece_counts(word_counts, lambda word: range(len(word)), params)  # all starts

    def _with_chars(self, tokens: dict) -> dict:
        return lib.ensure_all_tokens_exist(self.char_tokens, tokens, self.params.include_joiner_token,
                                           self.params.joiner)

    def vocab(self, thresh: int) -> list[str]:
        params = self.params
        curr_tokens = self._with_chars({})  # the library's tokens before its first pass
        if params.num_iterations >= 1:
            curr_tokens = self._with_chars(_kept(self.first_pass, thresh))
        for _ in range(1, params.num_iterations):
            def starts_of(word, tokens=curr_tokens):  # the library skips words it cannot split
                ends = lib.get_split_indices(word, tokens, params.include_joiner_token, params.joiner)
                return [0, *ends[:-1]] if ends else ()

            curr_tokens = self._with_chars(_kept(_piece_counts(self.word_counts, starts_of, params), thresh))
        return lib.generate_final_vocabulary(params.reserved_tokens, self.char_tokens, curr_tokens)


def learn(word_counts, vocab_size: int, reserved_tokens: list[str], upper_thresh: Optional[int] = int(1e7),
          lower_thresh: Optional[int] = 10, num_iterations: int = 4, max_input_tokens: Optional[int] = int(5e6),
          max_token_length: int = 50, max_unique_chars: int = 1000, slack_ratio: float = 0.05,
          include_joiner_token: bool = True, joiner: str = "##") -> list[str]:
    """The library's `learn` (same arguments and defaults, same vocabulary), faster; see the module docstring.

    `lower_thresh` must be ≥ 1 (or None): with a threshold below 1 the library also keeps
    tokens whose count is 0, which this counting does not see.
    """
    if lower_thresh is not None and lower_thresh < 1:
        raise ValueError(f"lower_thresh must be >= 1, got {lower_thresh}")
    if isinstance(word_counts, dict):
        word_counts = word_counts.items()
    params = lib.Params(upper_thresh, lower_thresh, num_iterations, max_input_tokens, max_token_length,
                        max_unique_chars, vocab_size, slack_ratio, include_joiner_token, joiner, reserved_tokens)
    upper, lower = lib.get_search_threshs(word_counts, params.upper_thresh, params.lower_thresh)
    all_counts = lib.get_input_words(word_counts, params.reserved_tokens, params.max_token_length)
    allowed_chars = lib.get_allowed_chars(all_counts, params.max_unique_chars)
    learner = _Learner(lib.filter_input_words(all_counts, allowed_chars, params.max_input_tokens), params)
    slack_count = max(params.slack_ratio * params.vocab_size, 0)
    while True:  # the library's `learn_binary_search`, as a loop
        thresh = (upper + lower) // 2
        vocab = learner.vocab(thresh)
        within_slack = len(vocab) <= params.vocab_size and params.vocab_size - len(vocab) <= slack_count
        if within_slack or lower >= upper or thresh <= 1:
            return vocab
        if len(vocab) > params.vocab_size:
            lower = thresh + 1
        else:
            upper = thresh - 1
