"""Damaged or missing artifacts through the inference scripts' `main(argv)`: one `error:` line
naming the broken file, a `hint:` with the command that rebuilds it, exit status 2, no traceback.

Each row copies the session's tiny run directory (tests/conftest.py `tiny_run`) and breaks one
part of it. Two rows check that odd but valid input (a binary file, a 1 MB line) translates.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import script_main

from transformer.base import errors


def copy_run(tiny_run: Path, tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(tiny_run, run)
    return run


def damage(path: Path, data: bytes = b"\x08\xff garbage \x00" * 8) -> None:
    path.write_bytes(data)


def truncate_checkpoint(run: Path) -> None:
    data = sorted((run / "checkpoints").glob("ckpt-*.data-*"))[-1]
    data.write_bytes(data.read_bytes()[:16])


def other_architecture(run: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    config["model"]["d_model"] = 32
    (run / "config.json").write_text(json.dumps(config))


def fake_export(tmp: Path) -> Path:
    export = tmp / "export"
    (export / "variables").mkdir(parents=True)
    damage(export / "saved_model.pb")
    return export


# (id, script, setup(run, tmp) -> argv, message regex, hint regex)
CASES = [
    ("tokenizer saved_model.pb corrupt", "translate",
     lambda r, t: damage(r / "tokenizers" / "saved_model.pb") or ["--model", str(r), "Deus é amor."],
     r"tokenizer SavedModel .* is damaged: .*tokenizers/saved_model\.pb cannot be loaded", "build_tokenizers.py"),
    ("tokenizer variables/ missing", "translate",
     lambda r, t: shutil.rmtree(r / "tokenizers" / "variables") or ["--model", str(r), "x"],
     r"tokenizers is incomplete: missing variables", "build_tokenizers.py"),
    ("config.json missing", "translate",
     lambda r, t: (r / "config.json").unlink() or ["--model", str(r), "x"],
     r"neither an exported SavedModel .* nor a training run directory", "--model takes"),
    ("config.json not JSON", "translate",
     lambda r, t: damage(r / "config.json", b"{") or ["--model", str(r), "x"],
     r"config\.json is missing or damaged: .*not valid JSON", "scripts/train.py"),
    ("config.json of another architecture", "translate",
     lambda r, t: other_architecture(r) or ["--model", str(r), "x"],
     r"checkpoint .*ckpt-\d+ does not match the model of its config \(.*config\.json\)", "same run"),
    ("checkpoint data truncated", "translate",
     lambda r, t: truncate_checkpoint(r) or ["--model", str(r), "x"],
     r"checkpoint .*ckpt-\d+ is damaged", "--checkpoint"),
    ("no averaged checkpoint", "translate", lambda r, t: ["--model", str(r), "--checkpoint", "averaged", "x"],
     r"no averaged checkpoint in .*averaged", "average_checkpoints.py"),
    ("no ema checkpoint (trained without --ema-decay)", "translate", lambda r, t: ["--model", str(r), "--checkpoint", "ema", "x"],
     r"no ema checkpoint in .*/ema", "--ema-decay"),
    ("--model does not exist", "translate", lambda r, t: ["--model", str(t / "nope"), "x"],
     r"nope is neither an exported SavedModel", "--model takes"),
    ("--file missing", "translate", lambda r, t: ["--model", str(r), "--file", str(t / "nope.txt")],
     r"--file .*nope\.txt: file not found", "text file"),
    ("--file is a directory", "translate", lambda r, t: ["--model", str(r), "--file", str(t)],
     r"--file .*: is a directory", "text file"),
    ("export saved_model.pb corrupt", "translate", lambda r, t: ["--model", str(fake_export(t)), "x"],
     r"export .* is damaged: .*saved_model\.pb cannot be loaded", "scripts/export.py"),
    ("export over an existing directory", "export", lambda r, t: ["--run", str(r), "--output", str(t)],
     r"already exists; pass overwrite=True \(--overwrite\)", "--overwrite"),
    ("evaluate: --src/--ref line counts differ", "evaluate",
     lambda r, t: (t / "s.pt").write_text("a\nb\n") and (t / "r.en").write_text("a\n") and
     ["--model", str(r), "--src", str(t / "s.pt"), "--ref", str(t / "r.en"), "--output", str(t / "e.json")],
     r"line counts differ: .*s\.pt has 2 lines", "same length"),
    ("average_checkpoints: config.json missing", "average_checkpoints",
     lambda r, t: (r / "config.json").unlink() or [str(r), "--last", "2"], r"config\.json", "."),
]


@pytest.mark.parametrize("name, script, setup, message, hint", CASES, ids=[c[0] for c in CASES])
def test_broken_artifact_is_named(name, script, setup, message, hint, tiny_run, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    run = copy_run(tiny_run, tmp_path)
    code = script_main(script)(setup(run, tmp_path))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-2].startswith("error: ") and re.search(message, lines[-2]), err
    assert lines[-1].startswith("hint: ") and hint in lines[-1], err


def test_odd_but_valid_input_translates(tiny_run, tmp_path, capsys):
    """A binary file and a 1 MB line: one translation per input line (a line ends at \\n or
    \\r\\n; other Unicode breaks such as \\x0b or \\x85 stay inside it), exit 0."""
    binary = tmp_path / "binary.pt"
    binary.write_bytes(bytes(range(256)) * 4)
    text = binary.read_bytes().decode("utf-8", "replace")
    expected = text.count("\n") + (not text.endswith("\n"))
    assert expected == 5 < len(text.splitlines())  # str.splitlines would have split at \x0b, \x0c, \x1c…
    assert script_main("translate")(["--model", str(tiny_run), "--file", str(binary)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == expected

    long_line = tmp_path / "long.pt"
    long_line.write_text("Deus é amor.\n" + "palavra " * 131072 + "\nfim\n")  # a 1 MB line in the middle
    assert script_main("translate")(["--model", str(tiny_run), "--file", str(long_line)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
