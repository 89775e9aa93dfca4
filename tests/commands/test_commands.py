"""The entry points: commands import no TensorFlow, check versions first, scripts are thin.

One child process (no TensorFlow in it, ~1 s) imports every command and runs each `main`
with the version check planted to fail: each must stop with status 2 before TensorFlow is
imported. The scripts must be thin callers of the package (no sys.path edits).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from transformer.base import cli

REPO_ROOT = Path(__file__).resolve().parents[2]

# Minimal argv that parses for each command (the version check comes right after parsing).
ARGV = {
    "train": [],
    "build_tokenizers": [],
    "translate": ["--model", "missing", "olá"],
    "evaluate": ["--model", "missing", "--data", "missing"],
    "export": ["--run", "missing", "--output", "missing-export"],
    "average_checkpoints": ["missing"],
    "benchmark": ["--steps", "1"],
    "benchmark_decoding": ["--run", "missing"],
    "compare_reports": ["a.json", "b.json"],
    "tune_decoding": ["--run", "missing"],
    "serve": ["missing"],
    "benchmark_serving": ["missing"],
    "benchmark_subword": ["--tokenizer", "sentencepiece", "--subword-alpha", "0.1"],
    "benchmark_ema": [],
    "benchmark_xla": [],
    "benchmark_pipeline": [],
}

CHILD = """
import importlib, json, sys
from transformer.base import cli, versions

def mismatch(*args, **kwargs):
    raise versions.VersionMismatchError("planted mismatch")

cli.check_versions = mismatch
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    module = importlib.import_module(f"transformer.commands.{name}")
    imported_tf_on_import = "tensorflow" in sys.modules
    try:
        status = module.main(argv)
    except SystemExit as exit:
        status = exit.code
    results[name] = {"status": status, "tf_on_import": imported_tf_on_import, "tf_after": "tensorflow" in sys.modules}
print(json.dumps(results))
"""


def test_every_command_is_listed_and_has_an_argv_here():
    modules = {p.stem for p in (REPO_ROOT / "transformer" / "commands").glob("*.py")} - {"__init__"}
    assert modules == set(cli.COMMANDS) == set(ARGV)


def test_commands_import_no_tensorflow_and_check_versions_before_importing_it():
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(ARGV)], capture_output=True, text=True,
                            timeout=120, env=cli.subprocess_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(results) == set(ARGV)
    for name, outcome in results.items():
        assert outcome == {"status": 2, "tf_on_import": False, "tf_after": False}, name
    assert result.stderr.count("error: planted mismatch") == len(ARGV)


@pytest.mark.parametrize("name", cli.COMMANDS)
def test_scripts_are_thin_callers_of_the_commands(name):
    source = (REPO_ROOT / "scripts" / f"{name}.py").read_text()
    assert "sys.path" not in source
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert [(node.module, [a.name for a in node.names]) for node in imports] == [(f"transformer.commands.{name}", ["main"])]
    assert len(source.splitlines()) <= 15


def test_a_script_runs_from_anywhere_with_the_package_importable(tmp_path):
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "translate.py"), "--help"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path, env=cli.subprocess_env())
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout and "--beam" in result.stdout


def test_command_line_runs_this_checkouts_command(tmp_path):
    result = subprocess.run(cli.command_line("compare_reports", "--help"), capture_output=True, text=True,
                            timeout=60, cwd=tmp_path, env=cli.subprocess_env({"PATH": ""}))
    assert result.returncode == 0, result.stderr
    assert "step-time reports" in result.stdout
    with pytest.raises(ValueError, match="unknown command"):
        cli.command_line("nope")


ONEDNN_CHILD = """
import importlib, json, sys
from transformer.base import cli

cli.check_versions = lambda *args, **kwargs: None
results = {}
for label, (name, argv) in json.loads(sys.argv[1]).items():
    module = importlib.import_module(f"transformer.commands.{name}")

    def record(choice, dtype="float32", label=label):
        results[label] = {"choice": choice, "dtype": dtype, "tf_loaded": "tensorflow" in sys.modules}
        raise SystemExit(99)

    module.configure_onednn = record
    try:
        module.main(argv)
    except SystemExit:
        pass
print(json.dumps(results))
"""
DECODING_COMMANDS = ("translate", "evaluate", "serve", "benchmark_decoding", "benchmark_serving")


def test_decoding_commands_set_onednn_before_tensorflow_loads(tmp_path):
    bf16_export = tmp_path / "export-bf16"
    bf16_export.mkdir()
    (bf16_export / "translator.json").write_text(json.dumps({"dtype": "bfloat16"}))
    cases = {name: [name, ARGV[name] + ["--onednn", "off"]] for name in DECODING_COMMANDS}
    cases |= {f"{name} auto": [name, ARGV[name]] for name in DECODING_COMMANDS}  # the default: auto
    cases |= {"serve bf16 export": ["serve", [str(bf16_export)]],
              "translate bf16 export": ["translate", ["--model", str(bf16_export), "olá"]],
              "benchmark_decoding bf16 engine": ["benchmark_decoding", ["--run", "missing", "--compare", "ctranslate2",
                                                                        "--ours", "export", "export-bf16"]],
              "benchmark_decoding bf16 profile": ["benchmark_decoding", ["--run", "missing", "--profile",
                                                                         "--dtype", "bfloat16"]]}
    result = subprocess.run([sys.executable, "-c", ONEDNN_CHILD, json.dumps(cases)], capture_output=True, text=True,
                            timeout=120, env=cli.subprocess_env(), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.strip().splitlines()[-1])
    expected = {name: {"choice": "off", "dtype": "float32", "tf_loaded": False} for name in DECODING_COMMANDS}
    expected |= {f"{name} auto": {"choice": "auto", "dtype": "float32", "tf_loaded": False} for name in DECODING_COMMANDS}
    expected |= {label: {"choice": "auto", "dtype": "bfloat16", "tf_loaded": False}
                 for label in ("serve bf16 export", "translate bf16 export", "benchmark_decoding bf16 engine",
                               "benchmark_decoding bf16 profile")}
    assert results == expected


def test_commands_hide_tensorflows_python_info_lines(tmp_path, caplog):
    """`cli.start()` hides the INFO lines TensorFlow's Python side logs through absl, such as one
    per checkpoint written ("Sharding callback duration"), and through its own logger (a
    SavedModel's "Assets written to"), and keeps the project's own."""
    import logging

    import tensorflow as tf

    loggers = [logging.getLogger(name) for name in ("absl", "tensorflow")]
    levels = [logger.level for logger in loggers]
    try:
        cli.quiet_tensorflow()
        with caplog.at_level(logging.INFO):
            tf.train.Checkpoint(v=tf.Variable(1.0)).write(str(tmp_path / "ckpt"))
            tf.saved_model.save(tf.Module(), str(tmp_path / "saved"))
            logging.getLogger("transformer.training.trainer").info("epoch 1: checkpoint")
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
    assert [record.name for record in caplog.records] == ["transformer.training.trainer"]
