"""The Colab notebooks: stored clean, in sync with their percent-format sources, running top to bottom.

Execution is headless with nbclient on the shared Bible corpus and a tiny configuration: the
test inserts an `injected-parameters` cell right after the cell tagged `parameters` (what
papermill does), so the notebooks run exactly as committed, only smaller. Any cell error
fails the test (nbclient raises CellExecutionError with the cell's traceback).

The kernel is this interpreter (`sys.executable`) through a kernelspec written to a temporary
directory, so the notebooks run in the same environment as pytest whatever kernelspecs the
machine has installed (a fresh `pip install -r requirements.txt` venv is enough).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from conftest import REPO_ROOT, TOKENIZER_PAIRS, TOKENIZER_VOCAB, tokenizers_reused
from jupyter_core.utils import run_sync

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
NOTEBOOK_01 = "01_train_cpu_vs_gpu.ipynb"
NOTEBOOK_02 = "02_translate_and_export.ipynb"
NOTEBOOKS = (NOTEBOOK_01, NOTEBOOK_02)
SOURCES = {name: name.replace(".ipynb", ".py") for name in NOTEBOOKS}  # jupytext percent format
# Rewrites every .ipynb from its .py, keeping cell ids (and outputs, which are stored empty).
REGENERATE = "jupytext --update --to ipynb notebooks/0*.py"
CELL_TIMEOUT_S = 600

# The corpus slice, vocabulary and case of the session tokenizers (conftest.bible_tokenizers), and
# their TOKENIZER_ROOT: the notebooks reuse them (asserted) instead of learning their own.
TINY_MODEL = dict(MAX_TRAIN_EXAMPLES=TOKENIZER_PAIRS, MAX_VAL_EXAMPLES=20, VOCAB_SIZE=TOKENIZER_VOCAB, LOWER_CASE=True,
                  NUM_LAYERS=1, D_MODEL=16, NUM_HEADS=2, DFF=32, MAX_LENGTH=32)
TINY = {
    NOTEBOOK_01: dict(TINY_MODEL, STEPS=3, VALIDATION_STEPS=1, BATCH_SIZE=16, MAX_TOKENS=256,
                      RUNS=[("naive", "off", False), ("optimized", "auto", True)]),  # auto: pinned off (conftest)
    NOTEBOOK_02: dict(TINY_MODEL, EPOCHS=1, STEPS=3, EVAL_LIMIT=20),
}


def _load(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS_DIR / name, as_version=4)


def _parameters_cell_index(notebook) -> int:
    tagged = [i for i, cell in enumerate(notebook.cells) if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"expected exactly one cell tagged 'parameters', found {len(tagged)}"
    return tagged[0]


def _assigned_names(source: str) -> set:
    return {target.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)}


def with_parameters(notebook, overrides: dict):
    """A copy of `notebook` with an `injected-parameters` cell after its parameters cell.

    Every override must name a knob the parameters cell defines: a renamed parameter fails
    here instead of being silently ignored.
    """
    notebook = nbformat.from_dict(json.loads(json.dumps(notebook)))  # deep copy
    index = _parameters_cell_index(notebook)
    known = _assigned_names(notebook.cells[index].source)
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"overrides {unknown} are not parameters of this notebook; parameters: {sorted(known)}")
    source = "# Injected by tests/commands/test_notebooks.py\n" + "\n".join(f"{k} = {v!r}" for k, v in overrides.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    cell["id"] = "injected-parameters"
    notebook.cells.insert(index + 1, cell)
    return notebook


def execute(notebook, cwd: Path, kernel_dir: Path):
    """Runs every cell in a fresh kernel on this interpreter; raises CellExecutionError on a cell error."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient

    write_kernel_spec(kernel_dir / "nmt-notebook-test")  # argv: [sys.executable, "-m", "ipykernel_launcher", ...]
    km = AsyncKernelManager(kernel_name="nmt-notebook-test",
                            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)]))
    client = NotebookClient(notebook, km=km, timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(cwd)}})
    try:
        # The kernel starts as a user's would: without the allocator choice earlier tests left in os.environ.
        client.execute(env={k: v for k, v in os.environ.items() if not k.startswith("TF_CPU_")})
    finally:  # nbclient shuts down only kernels it started itself; this one (TensorFlow loaded: ~1.2 GB) too
        if km.has_kernel:
            run_sync(km.shutdown_kernel)(now=True)
    return notebook


def _kernels() -> set:
    """pids of this process's running notebook kernels."""
    return {child.pid for child in psutil.Process().children(recursive=True)
            if "ipykernel_launcher" in " ".join(child.cmdline())}


def _outputs_text(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/markdown", ""))
    return "\n".join(parts)


# ----------------------------------------------------------------------------- stored form


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_has_no_outputs_and_a_parameters_cell_first(name):
    notebook = _load(name)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    for cell in code:
        assert cell.outputs == [] and cell.execution_count is None, f"{name} cell {cell.id} is stored with outputs"
    assert "parameters" in code[0].metadata.get("tags", []), f"{name}: the first code cell must be the parameters cell"
    _parameters_cell_index(notebook)
    assert notebook.metadata.kernelspec.name == "python3"


def test_every_notebook_has_a_percent_source():
    assert sorted(path.stem for path in NOTEBOOKS_DIR.glob("*.ipynb")) == \
        sorted(path.stem for path in NOTEBOOKS_DIR.glob("*.py")) == sorted(Path(name).stem for name in NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_generated_from_its_percent_source(name, tmp_path):
    """The stored .ipynb is what REGENERATE writes from the .py: same cells, types, sources, tags
    (the parameters cell) and Colab metadata, byte for byte (cell ids are kept by --update)."""
    import jupytext
    from jupytext.cli import jupytext as jupytext_cli

    source = NOTEBOOKS_DIR / SOURCES[name]
    hint = f"notebooks/{name} is out of sync with notebooks/{source.name} (the source to edit): run {REGENERATE}"
    stored, text = _load(name), jupytext.read(source)
    assert [(c.cell_type, c.source, c.metadata) for c in stored.cells] == \
        [(c.cell_type, c.source, c.metadata) for c in text.cells], hint
    for key in ("colab", "accelerator", "kernelspec", "language_info"):
        assert stored.metadata.get(key) == text.metadata.get(key), f"metadata {key!r}: {hint}"
    assert "colab" in stored.metadata

    regenerated = tmp_path / name
    shutil.copy(NOTEBOOKS_DIR / name, regenerated)
    jupytext_cli(["--quiet", "--update", "--to", "ipynb", "--output", str(regenerated), str(source)])
    assert regenerated.read_text(encoding="utf-8") == (NOTEBOOKS_DIR / name).read_text(encoding="utf-8"), hint


def test_setup_paths_resolve_against_the_clone(tmp_path):
    """The setup cell's paths: "auto" data is the Bible corpus next to a local clone (TFDS on
    Colab or when absent), relative outputs and tokenizers live inside the clone."""
    from transformer.base.notebook_setup import resolve_paths

    repo = tmp_path / "clone"
    repo.mkdir()
    local = resolve_paths(repo, in_colab=False, data_dir="auto", output_root="runs/nb", tokenizer_root=None,
                          save_to_drive=False)
    assert local.data_dir is None  # no ../shared corpus next to this clone
    assert local.output_root == repo / "runs" / "nb" and local.output_root.is_dir()
    assert local.tokenizer_root == repo / "runs" / "nb" / "tokenizers"
    (tmp_path / "shared" / "data" / "bible-pt-en").mkdir(parents=True)
    here = resolve_paths(repo, in_colab=False, data_dir="auto", output_root=tmp_path / "abs", tokenizer_root="tok",
                         save_to_drive=True)  # Drive applies on Colab only
    assert here.data_dir == str(tmp_path / "shared" / "data" / "bible-pt-en")
    assert here.output_root == tmp_path / "abs" and here.tokenizer_root == repo / "tok"
    colab = resolve_paths(repo, in_colab=True, data_dir="auto", output_root="out", tokenizer_root=None,
                          save_to_drive=False)
    assert colab.data_dir is None
    assert resolve_paths(repo, False, "/my/corpus", "out", None, False).data_dir == "/my/corpus"


def test_injection_rejects_unknown_parameters():
    with pytest.raises(ValueError, match="NOT_A_KNOB"):
        with_parameters(_load(NOTEBOOK_01), {"NOT_A_KNOB": 1})


def test_a_cell_error_fails_the_execution(tmp_path):
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                               nbformat.v4.new_code_cell("raise ValueError('broken cell')")])
    before = _kernels()
    with pytest.raises(CellExecutionError, match="broken cell"):
        execute(notebook, cwd=tmp_path, kernel_dir=tmp_path / "kernels")
    assert _kernels() <= before, "the notebook's kernel is still running"


# ----------------------------------------------------------------------------- execution


def _run(name: str, bible_tokenizers, tmp_path: Path):
    output_root = tmp_path / "out"
    overrides = dict(TINY[name], DATA_DIR=bible_tokenizers.data_config.data_dir, OUTPUT_ROOT=str(output_root),
                     TOKENIZER_ROOT=bible_tokenizers.config.root)
    notebook = with_parameters(_load(name), overrides)
    started = time.perf_counter()
    with tokenizers_reused(bible_tokenizers):
        execute(notebook, cwd=NOTEBOOKS_DIR, kernel_dir=tmp_path / "kernels")
    print(f"{name}: executed in {time.perf_counter() - started:.0f} s")
    return notebook, output_root


def test_notebook_01_trains_with_each_toggle_and_compares_the_reports(bible_tokenizers, tmp_path):
    notebook, output_root = _run(NOTEBOOK_01, bible_tokenizers, tmp_path)
    reports = sorted(output_root.glob("*/report.json"))
    assert [path.parent.name for path in reports] == ["cpu-naive-fp32-noxla", "cpu-optimized-fp32-xla-auto"]
    for path in reports:
        report = json.loads(path.read_text())
        assert report["state"] == "completed" and report["steps_done"] == 3
        assert report["environment"]["cpu_allocator"]["running"] == "bfc"  # setup asked, as train.py does
    # "auto" is decided by transformer.runtime.precision, as training decides it (pinned to off in tests).
    decision = json.loads(reports[1].read_text())["run"]["precision_decision"]
    assert decision["requested"]["mixed_precision"] == "auto" and decision["mixed_precision"] == "off"
    assert decision["xla"] is True
    table = (output_root / "comparison.md").read_text()
    assert "| cpu-naive-fp32-noxla |" in table and "| cpu-optimized-fp32-xla-auto |" in table
    assert (output_root / "comparison.png").stat().st_size > 0
    text = _outputs_text(notebook)
    assert "TensorFlow sees:" in text and "| Run | Device |" in text
    assert f"precision float32, XLA on: {decision['reason']}" in text


def test_notebook_02_translates_scores_exports_and_reloads(bible_tokenizers, tmp_path):
    notebook, output_root = _run(NOTEBOOK_02, bible_tokenizers, tmp_path)
    assert (output_root / "attention.png").stat().st_size > 0
    evaluation = json.loads((output_root / "eval.json").read_text())
    assert evaluation["num_sentences"] == TINY[NOTEBOOK_02]["EVAL_LIMIT"] and "bleu" in evaluation
    assert (output_root / "export" / "saved_model.pb").is_file()
    text = _outputs_text(notebook)
    assert "translates exactly as the in-memory model" in text
    assert "precision float32, XLA off: auto pinned by $TRANSFORMER_AUTO_PRECISION=off" in text  # PRECISION "auto"
