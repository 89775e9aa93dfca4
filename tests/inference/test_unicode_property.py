"""Property: any batch of Unicode strings gives one translation per input row, never a crash.

Hypothesis feeds the in-memory Translator and the exported serving signature random text —
control characters, combining marks, emoji, private-use and unassigned code points, empty
strings, whitespace, very long lines — in batches of 0..5 rows. The model is tiny and
random (what it translates to does not matter here; that every row comes back does).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SPECIAL = [
    "",
    " \t\r\n\x0b\x0c",
    "\x00\x01\x07\x1b[31m\x7f\x85",  # C0/C1 controls, an ANSI escape
    "e\u0301\u0301\u0301 a\u0300\u0323\u0328",  # stacked combining marks
    "\u0301começa com um acento",
    "😀👨‍👩‍👧‍👦🇧🇷🏳️‍🌈",  # emoji, ZWJ sequences, flags
    "\u200b\u200d\ufeff\u2028\u2029",  # zero-width, BOM, line/paragraph separators
    "\ue000\U000f0000\U0010fffd",  # private use
    "palavra " * 1250,  # 10,000 characters
    "x" * 100_000,  # one 100 kB word
    "\u202eRTL override\u202c עברית العربية",
]
# Any code point UTF-8 can carry (surrogates cannot): Hypothesis favours the edge cases.
TEXT = st.one_of(st.text(st.characters(exclude_categories=["Cs"]), max_size=60), st.sampled_from(SPECIAL))
BATCHES = st.lists(TEXT, min_size=0, max_size=5)
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def translator(tiny_export):
    return tiny_export[0]


@pytest.fixture(scope="module")
def exported(tiny_export):
    from transformer.inference.export import load_exported

    return load_exported(tiny_export[1])


def check_rows(sentences: list[str], translations) -> None:
    assert len(translations) == len(sentences)
    assert all(isinstance(t, str) for t in translations)


@SETTINGS
@given(sentences=BATCHES)
def test_translator_returns_one_row_per_input(translator, sentences):
    check_rows(sentences, translator.translate(sentences))


@SETTINGS
@given(sentences=BATCHES)
def test_exported_signature_returns_one_row_per_input(exported, sentences):
    check_rows(sentences, exported.translate(sentences))  # the serving signature: [N] string → [N] string
