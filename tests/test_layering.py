"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and they can fail.

`lint-imports` builds the import graph statically (grimp: no module is executed, TF is
not imported), so this is cheap. The negative control plants an upward import in a copy
of the package and checks that the contracts then break.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """Runs import-linter on the package found at `cwd` (with the pyproject.toml there)."""
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env={"PYTHONPATH": str(cwd), "PATH": ""},
                          capture_output=True, text=True, timeout=120)


def test_import_contracts_are_kept():
    result = _lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _lint_with_plants(tmp_path: Path, plants: dict[str, str]) -> subprocess.CompletedProcess:
    """Lints a copy of the package in which `plants` {module file: code} are appended."""
    shutil.copytree(REPO_ROOT / "transformer", tmp_path / "transformer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for name, code in plants.items():
        with open(tmp_path / "transformer" / name, "a") as f:
            f.write(code)
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    return result


def test_a_planted_upward_import_breaks_the_layers_contract(tmp_path):
    result = _lint_with_plants(tmp_path, {
        "model/transformer.py": "\nfrom transformer.training.trainer import train  # planted: model → training is upward\n"})
    assert "Layers: no module imports from a layer above its own BROKEN" in result.stdout
    assert "transformer.model.transformer -> transformer.training.trainer" in result.stdout


def test_a_planted_cycle_and_a_tensorflow_import_in_the_base_layer_break_the_contracts(tmp_path):
    result = _lint_with_plants(tmp_path, {
        "base/constants.py": "\nimport tensorflow  # planted\n",
        "inference/translator.py":
            "\n\ndef _late():\n    from transformer.inference.export import open_translator  # planted cycle\n"})
    assert "TensorFlow-free (config, flags, constants load without TF) BROKEN" in result.stdout
    assert "No import cycles between the package's modules BROKEN" in result.stdout
