"""scripts/tune_decoding.py on the session's tiny run: the length-penalty grid, interleaved
greedy/beam timing in memory and through exports that must translate like the in-memory
Translator."""

from __future__ import annotations

import json

import pytest
from conftest import script_main

from transformer.inference.decode_tuning import best_alpha, interleaved_speed


def test_tune_decoding_main_reports_grid_and_interleaved_speed(tiny_run, bible_dir, tmp_path):
    output = tmp_path / "tuning.json"
    assert script_main("tune_decoding")(["--run", str(tiny_run), "--data", str(bible_dir), "--limit", "6",
                                         "--beams", "2", "--alphas", "0", "1", "--exported", "--rounds", "1",
                                         "--speed-sentences", "4", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    grid = {row["name"]: row for row in report["quality_grid"]}
    assert set(grid) == {"greedy", "beam 2, alpha 0", "beam 2, alpha 1"}
    assert [row["bleu"] for row in report["quality_grid"]] == sorted((r["bleu"] for r in grid.values()), reverse=True)
    beam = f"beam 2, alpha {best_alpha(report['quality_grid'], 2):g}"
    speed = {row["decoder"]: row for row in report["speed"]}
    assert set(speed) == {"greedy", beam, "greedy (exported)", f"{beam} (exported)"}
    assert speed["greedy"]["fraction_of_greedy"] == 1.0 and speed["greedy"]["bleu_gain"] == 0.0
    assert speed[beam]["bleu_gain"] == round(grid[beam]["bleu"] - grid["greedy"]["bleu"], 2)
    assert all(len(row["rounds_s"]) == 1 and row["sentences_per_s"] > 0 for row in speed.values())
    assert report["speed_sentences"] == 4 and report["num_sentences"] == 6


def test_interleaved_speed_times_every_decoder_each_round_and_catches_nondeterminism():
    order = []

    def fixed(name):
        def translate(sentences):
            order.append(name)
            return [s.upper() for s in sentences], [1] * len(sentences)
        return translate

    result = interleaved_speed({"a": fixed("a"), "b": fixed("b")}, ["x", "y"], rounds=2, warmup=1)
    assert order == ["a", "b", "a", "b", "a", "b"]  # warm-up, then interleaved rounds
    assert result["a"]["translations"] == ["X", "Y"] and len(result["b"]["rounds_s"]) == 2
    calls = iter(range(100))
    with pytest.raises(RuntimeError, match="changed between passes"):
        interleaved_speed({"random": lambda s: ([str(next(calls))], [1])}, ["x"], rounds=2, warmup=0)
