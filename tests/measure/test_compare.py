"""Comparison of step-time reports: table, speed-ups, verdicts, plot, CLI errors."""


import pytest
from conftest import script_main, write_report

from transformer.measure.compare import compare, device_label, load_runs, speedups, verdict


@pytest.fixture
def two_reports(tmp_path):
    slow = write_report(tmp_path / "slow" / "report.json", "tutorial", step_s=0.2, wait_s=0.05)  # 25% wait
    fast = write_report(tmp_path / "fast.json", "optimized", step_s=0.1, wait_s=0.001, bleus=(3.0, 21.5, 20.0))  # 1% wait
    return slow, fast


def test_speedups_are_relative_to_the_first_report(two_reports):
    base, run = load_runs(two_reports)
    by_tokens, by_step = speedups(run, base)
    assert by_tokens == pytest.approx(2.0)
    assert by_step == pytest.approx(2.0)
    assert speedups(base, base) == pytest.approx((1.0, 1.0))


def test_verdicts_follow_the_wait_threshold(two_reports):
    base, run = load_runs(two_reports)
    assert verdict(base.summary) == "input-bound: 25% of step time waiting for data"
    assert verdict(run.summary) == "compute-bound"
    assert verdict(run.summary, threshold_pct=0.5).startswith("input-bound: 1%")
    assert verdict({"steady_steps": 3, "data_wait_pct": None}).startswith("unknown")


def test_compare_writes_table_and_plot(two_reports, tmp_path):
    plot, markdown = tmp_path / "out" / "steps.png", tmp_path / "out" / "table.md"
    table = compare(two_reports, plot=plot, markdown=markdown)
    lines = table.splitlines()
    tutorial = next(line for line in lines if line.startswith("| tutorial |"))
    optimized = next(line for line in lines if line.startswith("| optimized |"))
    assert "| 1.00x | 1.00x |" in tutorial and "input-bound: 25% of step time waiting for data" in tutorial
    assert "| 2.00x | 2.00x |" in optimized and "compute-bound" in optimized
    assert "| 6/6 |" in optimized and "| completed |" in optimized and "| 0.1000 |" in optimized
    assert optimized.endswith("| 6,000 | 21.50 |")  # target tokens trained on, best of the BLEU evaluations
    assert tutorial.endswith("| 6,000 | — |")  # no validation BLEU logged
    assert markdown.read_text() == table
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000


def test_labels_fall_back_to_file_names_and_stay_unique(two_reports, tmp_path):
    copy = tmp_path / "copy.json"
    write_report(copy, "tutorial", step_s=0.3, wait_s=0.0)
    assert [run.label for run in load_runs([*two_reports, copy])] == ["tutorial", "optimized", "tutorial#2"]


def test_bad_or_missing_report_names_the_file(two_reports, tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="nope.json"):
        compare([two_reports[0], missing])
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="bad.json"):
        compare([two_reports[0], bad])


def test_cli_prints_table_and_reports_errors(two_reports, tmp_path, capsys):
    main = script_main("compare_reports")
    plot, table = tmp_path / "cli.png", tmp_path / "cli.md"
    assert main([*map(str, two_reports), "--plot", str(plot), "--markdown", str(table)]) == 0
    out = capsys.readouterr().out
    assert "| optimized |" in out and plot.stat().st_size > 1000
    assert table.read_text().strip() == out.strip()  # the saved table is the printed one
    missing = str(tmp_path / "nope.json")
    assert main([str(two_reports[0]), missing]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_the_device_column_tells_apart_cpus_that_share_a_model_name():
    zen4 = {"device": "CPU", "cpu_model": "AMD EPYC", "cpu_id": "family 25 model 17 stepping 1",
            "cpu_budget": {"cpus": 2}}
    zen5 = {**zen4, "cpu_id": "family 26 model 2 stepping 1", "cpu_budget": {"cpus": 1}}
    assert device_label(zen4) == "AMD EPYC (family 25 model 17 stepping 1), 2 CPUs"
    assert device_label(zen5) == "AMD EPYC (family 26 model 2 stepping 1), 1 CPU"
    assert device_label({"device": "NVIDIA H100 80GB HBM3", "cpu_model": "AMD EPYC"}) == "NVIDIA H100 80GB HBM3"
    assert device_label({"device": "CPU"}) == "CPU"  # a report written before the CPU was recorded
