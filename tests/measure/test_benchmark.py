"""The benchmark matrix: cell expansion, and a real 2-cell run writing reports + comparison."""

import json
from pathlib import Path

import pytest
from conftest import script_main, tokenizers_reused, write_report

from transformer.base.constants import SHARED_CORPUS_DIR
from transformer.base.errors import ProjectError
from transformer.measure import benchmark
from transformer.measure.benchmark import Cell, make_cells

REPO = Path(__file__).resolve().parents[2]
BIBLE = SHARED_CORPUS_DIR


def test_cells_cross_levers_and_use_the_batch_unit_of_their_pipeline():
    cells = make_cells(["naive", "optimized"], ["off", "bfloat16"], [False, True], [32, 64], [4096])
    assert len(cells) == 2 * 2 * 2 + 1 * 2 * 2  # naive: 2 batch sizes, optimized: 1
    assert Cell("naive", "off", False, 64) in cells
    assert Cell("optimized", "bfloat16", True, 4096) in cells
    assert not any(c.pipeline == "naive" and c.batch == 4096 for c in cells)
    naive = Cell("naive", "bfloat16", True, 32).train_args()
    assert naive[naive.index("--batch-size") + 1] == "32" and "--xla" in naive
    optimized = Cell("optimized", "off", False, 4096).train_args()
    assert optimized[optimized.index("--max-tokens") + 1] == "4096" and "--no-xla" in optimized
    assert len({c.label for c in cells}) == len(cells)


def test_auto_cells_and_width_sweep_pass_their_flags():
    cells = make_cells(["optimized"], ["auto", "off"], [None, False], [64], [2048, 8192], d_models=[128, 256])
    assert len(cells) == 2 * 2 * 2 * 2 and len({c.label for c in cells}) == len(cells)
    auto = Cell("optimized", "auto", None, 2048, 256)
    assert auto in cells and auto.label == "optimized-auto-xlaauto-2048tok-d256"
    args = auto.train_args()
    assert args[args.index("--mixed-precision") + 1] == "auto" and args[args.index("--xla") + 1] == "auto"
    assert args[args.index("--d-model") + 1] == "256" and args[args.index("--dff") + 1] == "1024"
    assert "--d-model" not in Cell("optimized", "off", False, 2048).train_args()  # width from the model flags


def test_a_single_cell_prints_its_tables(tmp_path, monkeypatch):
    """One cell used to be an error ("only 1 cell(s) produced a report"); now it gets its tables."""

    def fake_run_cell(cell, output_root, common_args, timeout_s=None):  # the training itself is tested below
        return write_report(output_root / cell.label / "report.json", cell.label, step_s=0.5, wait_s=0.0)

    monkeypatch.setattr(benchmark, "run_cell", fake_run_cell)
    cell = Cell("optimized", "auto", None, 2048)
    table = benchmark.run_matrix([cell], tmp_path / "bench", [])
    assert f"| {cell.label} |" in table and "| 1.00x | 1.00x |" in table
    assert "Tgt tokens/s (real)" in (tmp_path / "bench" / "sweep.md").read_text()
    assert (tmp_path / "bench" / "comparison.png").stat().st_size > 1000
    monkeypatch.setattr(benchmark, "run_cell", lambda cell, root, *args: root / "absent" / "report.json")
    with pytest.raises(ProjectError, match="no cell produced a report"):
        benchmark.run_matrix([cell], tmp_path / "none", [])


@pytest.mark.skipif(not BIBLE.is_dir(), reason=f"shared corpus not found at {BIBLE}")
def test_two_cell_matrix_writes_one_report_per_cell_and_a_comparison(bible_tokenizers, tmp_path, capsys):
    """Each cell trains in its own process; the cells reuse the session tokenizers (the same
    corpus slice, vocabulary and root) instead of each learning and saving new ones."""
    out = tmp_path / "bench"
    config = bible_tokenizers.config
    argv = [
        "--data", str(BIBLE), "--steps", "3",
        "--pipelines", "naive", "optimized", "--naive-batches", "16", "--token-batches", "512",
        "--device", "cpu", "--output", str(out), "--",
        "--max-train-examples", str(bible_tokenizers.data_config.max_train_examples), "--max-val-examples", "20",
        "--vocab-size", str(config.vocab_size), "--lower-case", "--tokenizers-root", config.root,
        "--num-layers", "1", "--d-model", "16",
        "--num-heads", "2", "--dff", "32", "--no-probe-peak", "--bleu-sentences", "0",  # no untrained decode
    ]
    with tokenizers_reused(bible_tokenizers):
        assert script_main("benchmark")(argv) == 0  # each cell still trains in its own process
    assert "naive-off-noxla-16sent" in capsys.readouterr().out
    reports = sorted(out.glob("*/report.json"))
    assert [p.parent.name for p in reports] == ["naive-off-noxla-16sent", "optimized-off-noxla-512tok"]
    for path in reports:
        report = json.loads(path.read_text())
        assert report["state"] == "completed" and report["steps_done"] == 3
    table = (out / "comparison.md").read_text()
    assert "naive-off-noxla-16sent" in table and "optimized-off-noxla-512tok" in table
    assert (out / "comparison.png").stat().st_size > 1000
    sweep = (out / "sweep.md").read_text()
    assert "naive-off-noxla-16sent" in sweep and "Utilisation" in sweep
