"""The project speaks of itself only: no work-session or issue numbers in its text.

A measurement is named by machine, command and date; what a change did belongs in its commit
message. This scans every text file a user or contributor reads (README, docs, package, tests,
notebooks, scripts) for the words `grep -rniE "session [0-9]|issue #?[0-9]"` would find.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
HISTORY = re.compile("sess" + r"ion [0-9]|iss" + r"ue #?[0-9]", re.IGNORECASE)  # split: this file passes too
TEXT_SUFFIXES = {".md", ".py", ".ipynb", ".toml", ".txt", ".json", ".sh", ".yml", ".yaml"}
SCANNED = ["README.md", "docs", "transformer", "tests", "notebooks", "scripts", "pyproject.toml", ".ci"]


def project_text_files() -> list[Path]:
    """Every text file under SCANNED (caches and virtual environments excluded)."""
    files = []
    for name in SCANNED:
        path = REPO_ROOT / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        files += [p for p in candidates if p.is_file() and "__pycache__" not in p.parts
                  and (p.suffix in TEXT_SUFFIXES or p.parent.name == ".ci")]
    return files


@pytest.mark.parametrize("text, found", [
    ("measured in Sess" "ion 7 on an EPYC", True),
    ("iss" "ue #11's targets", True),
    ("see iss" "ue 24", True),
    ("masking keras#20320, its issues #1632 and #1833", False),
    ("a session of 30 minutes", False),
])
def test_the_history_pattern_finds_history_words_only(text, found):
    assert bool(HISTORY.search(text)) is found


def test_no_history_words_in_the_project():
    files = project_text_files()
    assert len(files) > 50 and REPO_ROOT / "README.md" in files
    hits = [f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()[:100]}"
            for path in files
            for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if HISTORY.search(line)]
    assert not hits, "history words (name the machine, command and date instead):\n" + "\n".join(hits)
