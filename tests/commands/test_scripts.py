"""The command-line scripts through their `main(argv)`, in-process, on one tiny trained run.

`conftest.tiny_run` is trained by scripts/train.py's own main; every other script reads it.
Each test checks what the script produces (its files, its printed lines, its numbers) against
an independent computation: the in-memory translator, sacrebleu, the checkpoints' raw values.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import sacrebleu
import tensorflow as tf
from conftest import TINY_RUN_STEPS, script_main

SENTENCES = ["No princípio, Deus criou os céus e a terra.", "", "Deus é amor.", "Jesus chorou."]
EVAL_PAIRS = 8


def translator_from(run, checkpoint="latest"):
    """The in-memory Translator over a run directory's checkpoint (greedy, the default decoding)."""
    from transformer.inference.rundir import translator_from_run

    return translator_from_run(run, checkpoint=checkpoint)


@pytest.fixture(scope="module")
def expected(tiny_run):
    """What the run's latest checkpoint translates SENTENCES to, in memory."""
    return translator_from(tiny_run).translate(SENTENCES)


@pytest.fixture(scope="module")
def exported(tiny_run, tmp_path_factory):
    """scripts/export.py on the tiny run (default decoding)."""
    path = tmp_path_factory.mktemp("export") / "translator"
    assert script_main("export")(["--run", str(tiny_run), "--output", str(path)]) == 0
    return path


def test_train_main_writes_the_run_its_flags_describe(tiny_run):
    config = json.loads((tiny_run / "config.json").read_text())
    assert (config["model"]["num_layers"], config["model"]["d_model"], config["model"]["max_length"]) == (1, 16, 24)
    assert config["train"]["steps_per_epoch"] == TINY_RUN_STEPS and config["train"]["mixed_precision"] == "off"
    report = json.loads((tiny_run / "report.json").read_text())
    assert report["state"] == "completed" and report["steps_done"] == TINY_RUN_STEPS
    assert (tiny_run / "tokenizers" / "saved_model.pb").is_file()


def test_build_tokenizers_main_reuses_the_directory_of_the_same_inputs(bible_tokenizers, capsys):
    data, config = bible_tokenizers.data_config, bible_tokenizers.config
    root = bible_tokenizers.directory.parent
    before = sorted(root.iterdir())
    argv = ["--data", data.data_dir, "--max-train-examples", str(data.max_train_examples),
            "--max-val-examples", str(data.max_val_examples), "--vocab-size", str(config.vocab_size), "--lower-case",
            "--tokenizers-root", config.root]
    assert script_main("build_tokenizers")(argv) == 0
    out = capsys.readouterr().out
    assert out.split()[0] == str(bible_tokenizers.directory)
    assert f"src vocab {int(bible_tokenizers.tokenizers.src.get_vocab_size())}," in out
    assert sorted(root.iterdir()) == before  # reused, nothing learned again


def test_translate_main_prints_one_line_per_input_as_the_in_memory_translator(tiny_run, expected, tmp_path, capsys):
    source = tmp_path / "sentences.pt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    plot = tmp_path / "attention.png"
    assert script_main("translate")(["--model", str(tiny_run), "--file", str(source),
                                     "--plot-attention", str(plot)]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == expected
    assert plot.stat().st_size > 1000 and str(plot) in captured.err


def test_translate_streams_a_file_to_output_in_order_with_a_progress_bar(exported, expected, tmp_path, capsys):
    order = [(i * 7) % len(SENTENCES) for i in range(150)]  # 150 lines, 3 blocks of 64, mixed lengths
    ends = ["\n", "\r\n"]
    body = "".join(SENTENCES[k] + ends[i % 2] for i, k in enumerate(order)).rstrip("\r\n")  # last line: no newline
    source, output = tmp_path / "big.pt", tmp_path / "out" / "big.en"
    source.write_text(body, encoding="utf-8")
    assert script_main("translate")(["--model", str(exported), "--file", str(source), "--output", str(output),
                                     "--block-lines", "64"]) == 0
    captured = capsys.readouterr()
    assert output.read_text(encoding="utf-8").split("\n") == [expected[k] for k in order] + [""]
    assert captured.out == "" and "150/150" in captured.err and "sentences/s" in captured.err
    assert sorted(p.name for p in output.parent.iterdir()) == ["big.en"]  # no temporary file left


def test_translate_without_a_progress_bar_still_says_how_many_lines_it_wrote(exported, expected, tmp_path, capsys):
    source, output = tmp_path / "in.pt", tmp_path / "out.en"
    source.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    assert script_main("translate")(["--model", str(exported), "--file", str(source), "--output", str(output),
                                     "--no-progress"]) == 0
    assert capsys.readouterr().err.strip().endswith(f"3 translations: {output}")
    assert output.read_text(encoding="utf-8").splitlines() == expected[:3]


def test_export_main_writes_a_savedmodel_that_translates_as_the_run(exported, expected):
    assert (exported / "saved_model.pb").is_file()
    reloaded = tf.saved_model.load(str(exported))
    outputs = reloaded.signatures["serving_default"](sentences=tf.constant(SENTENCES))["translations"]
    assert [text.decode("utf-8") for text in outputs.numpy()] == expected


def test_evaluate_main_scores_run_and_export_alike_with_sacrebleu(tiny_run, exported, bible_dir, tmp_path):
    references = (bible_dir / "validation.en").read_text(encoding="utf-8").splitlines()[:EVAL_PAIRS]
    export = tmp_path / "export"
    shutil.copytree(exported, export)  # the shared export stays as it is
    reports = {}
    for name, model, output in (("run", tiny_run, tmp_path / "run.json"),
                                ("export", export, None)):  # no --output: into the model's directory
        argv = ["--model", str(model), "--data", str(bible_dir), "--split", "validation",
                "--limit", str(EVAL_PAIRS), "--repeats", "0"]
        assert script_main("evaluate")(argv + (["--output", str(output)] if output else [])) == 0
        reports[name] = json.loads((output or export / "eval_validation.json").read_text(encoding="utf-8"))
    run, export = reports["run"], reports["export"]
    assert run["num_sentences"] == EVAL_PAIRS and len(run["translations"]) == EVAL_PAIRS
    assert run["translations"] == export["translations"] and run["bleu"] == export["bleu"]
    assert 0.0 <= run["bleu"] <= 100.0 and 0.0 <= run["chrf"] <= 100.0
    assert run["bleu"] == pytest.approx(sacrebleu.corpus_bleu(run["translations"], [references]).score, abs=0.01)
    assert run["speed"]["sentences_per_s"] > 0


def test_average_checkpoints_main_writes_the_mean_of_the_last_checkpoints(tiny_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)  # the shared run stays as it is
    inputs = tf.train.get_checkpoint_state(str(run / "checkpoints")).all_model_checkpoint_paths[-2:]
    assert len(inputs) == 2
    assert script_main("average_checkpoints")([str(run), "--last", "2"]) == 0
    assert "averaged checkpoint: " in capsys.readouterr().out
    first, second = ([w.numpy() for w in translator_from(run, path).model.weights] for path in inputs)
    averaged = translator_from(run, "averaged").model.weights
    assert sum(not np.array_equal(a, b) for a, b in zip(first, second)) > len(first) // 2  # really different
    for weight, a, b in zip(averaged, first, second):
        np.testing.assert_allclose(weight.numpy(), (a + b) / 2, rtol=1e-6, atol=1e-7)


def test_benchmark_decoding_main_reports_cached_equal_to_full_recompute(tiny_run, bible_dir, tmp_path):
    output = tmp_path / "decoding.json"
    assert script_main("benchmark_decoding")(["--run", str(tiny_run), "--data", str(bible_dir), "--limit", "6",
                                              "--baseline-sentences", "3", "--no-xla", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert report["num_sentences"] == 6 and report["baseline_sentences"] == 3
    assert report["identical_to_uncached_when_unbounded"] == 1.0  # cached decoding == the tutorial's recompute
    assert report["speedup"] > 0 and report["cached_batched"]["warm"]["sentences_per_s"] > 0
    assert 0.0 <= report["cached_batched"]["quality"]["bleu"] <= 100.0
