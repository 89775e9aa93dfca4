"""The benchmark matrix: cell expansion, and a real 2-cell run writing reports + comparison."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from transformer.benchmark import Cell, make_cells

REPO = Path(__file__).resolve().parents[1]
BIBLE = REPO.parent / "shared" / "data" / "bible-pt-en"


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


@pytest.mark.skipif(not BIBLE.is_dir(), reason=f"shared corpus not found at {BIBLE}")
def test_two_cell_matrix_writes_one_report_per_cell_and_a_comparison(tmp_path):
    out = tmp_path / "bench"
    command = [
        sys.executable, str(REPO / "scripts" / "benchmark.py"), "--data", str(BIBLE), "--steps", "3",
        "--pipelines", "naive", "optimized", "--naive-batches", "16", "--token-batches", "512",
        "--device", "cpu", "--output", str(out), "--",
        "--max-train-examples", "300", "--max-val-examples", "20", "--vocab-size", "400",
        "--tokenizers-root", str(tmp_path / "tok"), "--num-layers", "1", "--d-model", "16",
        "--num-heads", "2", "--dff", "32", "--no-probe-peak",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = sorted(out.glob("*/report.json"))
    assert [p.parent.name for p in reports] == ["naive-off-noxla-16sent", "optimized-off-noxla-512tok"]
    for path in reports:
        report = json.loads(path.read_text())
        assert report["state"] == "completed" and report["steps_done"] == 3
    table = (out / "comparison.md").read_text()
    assert "naive-off-noxla-16sent" in table and "optimized-off-noxla-512tok" in table
    assert (out / "comparison.png").stat().st_size > 1000
