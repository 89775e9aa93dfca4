"""Run-length machinery: schedules that know the planned length, the time budget, validation
BLEU with best-checkpoint keeping and early stopping, checkpoint averaging and presets."""

import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_config, tokenizers_reused
from helpers_translation import ScriptedTranslator

from transformer.base import cli
from transformer.base.config import ModelConfig
from transformer.base.presets import PRESETS
from transformer.inference.rundir import CONFIG_FILE, RunCheckpoints, average_checkpoints, build_model, load_trained_model
from transformer.model.optimizer import compile_model
from transformer.model.schedule import WarmupCosine, WarmupInverseSqrt
from transformer.training.trainer import train
from transformer.training.validation_bleu import ValidationBleu, fixed_sample


def lrs(schedule, steps):
    return np.array([float(schedule(tf.constant(s))) for s in steps])


def test_cosine_warms_up_peaks_and_decays_to_the_final_fraction():
    schedule = WarmupCosine(peak_lr=1e-3, warmup_steps=10, total_steps=110, final_fraction=0.1)
    warm, decay = lrs(schedule, range(0, 10)), lrs(schedule, range(9, 111))
    assert np.all(np.diff(warm) > 0) and warm[-1] == pytest.approx(1e-3)
    assert np.all(np.diff(decay) <= 1e-12) and decay[-1] == pytest.approx(1e-4)
    assert float(schedule(tf.constant(10_000))) == pytest.approx(1e-4)  # stays at the floor afterwards


def test_cosine_follows_a_progress_variable_instead_of_steps():
    progress = tf.Variable(0.0)
    schedule = WarmupCosine(peak_lr=2e-3, warmup_steps=5, progress=progress)
    at_start = float(schedule(tf.constant(100)))
    progress.assign(0.5)
    halfway = float(schedule(tf.constant(100)))  # same step, half the budget spent
    progress.assign(1.0)
    assert at_start == pytest.approx(2e-3) and halfway == pytest.approx(1e-3)
    assert float(schedule(tf.constant(100))) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ValueError, match="planned length"):
        WarmupCosine(peak_lr=1e-3, warmup_steps=5)


def test_inverse_sqrt_peak_lr_rescales_the_paper_curve():
    paper = WarmupInverseSqrt(d_model=128, warmup_steps=400)
    scaled = WarmupInverseSqrt(d_model=128, warmup_steps=400, peak_lr=1e-3)
    steps = [0, 100, 399, 1000, 5000]
    assert float(scaled(tf.constant(399))) == pytest.approx(1e-3)
    np.testing.assert_allclose(lrs(scaled, steps) / lrs(paper, steps), 1e-3 / float(paper(tf.constant(399))),
                               rtol=1e-5)


def test_presets_and_flags():
    args = cli_args(["--preset", "tutorial", "--pipeline", "naive"])
    config = cli.run_config_from_args(args)
    assert config.model == PRESETS["tutorial"].model and config.pipeline.kind == "naive"
    assert config.pipeline.batch_size == 64 and config.train.warmup_steps == 4000
    assert config.train.lr_schedule == "inverse-sqrt" and config.train.label_smoothing == 0.0
    overridden = cli.run_config_from_args(cli_args(["--preset", "tutorial", "--d-model", "64", "--time-budget", "30",
                                                    "--bucket-width", "4"]))
    assert overridden.model.d_model == 64 and overridden.model.num_layers == 4
    assert overridden.pipeline.bucket_width == 4
    assert overridden.train.time_budget_minutes == 30.0 and overridden.train.planned_epochs > 1000
    assert cli.run_config_from_args(cli_args([])) == PRESETS["default"]
    with pytest.raises(SystemExit):
        cli_args(["--preset", "nonsense"])
    with pytest.raises(ValueError, match="peak_learning_rate"):
        cli.run_config_from_args(cli_args(["--lr-schedule", "cosine", "--peak-lr", "-1"]))


def cli_args(argv):
    import argparse

    parser = argparse.ArgumentParser()
    for add in (cli.add_data_args, cli.add_tokenizer_args, cli.add_model_args, cli.add_pipeline_args,
                cli.add_train_args):
        add(parser)
    return parser.parse_args(argv)


def test_time_budget_stops_training_and_resume_keeps_the_spent_budget(bible_tokenizers, tmp_path):
    output = tmp_path / "run"
    budget_min = 0.25  # 15 s of training steps (the first one traces the step)
    # epochs of 50 steps: few epoch-end checkpoint saves (outside the budget, each costs more than a step)
    config = run_config(bible_tokenizers, output, validation=False, epochs=None, steps_per_epoch=50,
                        time_budget_minutes=budget_min, lr_schedule="cosine", peak_learning_rate=1e-3,
                        warmup_steps=2)
    with tokenizers_reused(bible_tokenizers):
        result = train(config)
    summary = result.summary
    assert summary["stopped_by"] == "time budget"
    assert budget_min * 60 <= summary["train_time_s"] < budget_min * 60 + 5  # stops at the first step past it
    assert summary["epochs_run"] >= 1 and summary["optimizer_steps"] > 2
    report = json.loads((output / "report.json").read_text())
    assert report["state"] == "completed" and report["run"]["stopped_by"] == "time budget"
    assert report["tokens_seen"]["tgt_tokens"] > 0
    # The final checkpoint holds the last step, and the lr schedule reached its end.
    model, _, _ = load_trained_model(output)
    for a, b in zip(model.weights, result.model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert float(result.model.optimizer.learning_rate) == pytest.approx(0.0, abs=1e-6)

    # Resuming with the same budget: it is already spent, so no step is taken.
    again = train(config.replace(train={"resume": True}))
    assert again.summary["optimizer_steps"] == summary["optimizer_steps"]
    assert again.summary["stopped_by"] == "time budget"


def test_validation_bleu_keeps_the_best_checkpoint_and_logs_tokens_seen(bible_tokenizers, tmp_path):
    output = tmp_path / "run"
    config = run_config(bible_tokenizers, output, epochs=1, steps_per_epoch=6, bleu_sentences=12,
                        bleu_every_steps=2, peak_learning_rate=3e-3, warmup_steps=3)
    with tokenizers_reused(bible_tokenizers):
        result = train(config)
    report = json.loads((output / "report.json").read_text())
    evaluations = report["evaluations"]
    assert [e["step"] for e in evaluations] == [2, 4, 6]  # every 2 steps; the epoch end adds none
    tokens = [e["tgt_tokens_seen"] for e in evaluations]
    assert all(t > 0 for t in tokens) and tokens == sorted(tokens) and len(set(tokens)) == 3
    best = json.loads((output / "best.json").read_text())
    assert best["bleu"] == max(e["bleu"] for e in evaluations)
    first_max = next(e for e in evaluations if e["bleu"] == best["bleu"])
    assert best["step"] == first_max["step"] and first_max["best"]
    assert result.summary["best_validation_bleu"]["bleu"] == best["bleu"]
    assert list((output / "tensorboard" / "bleu").glob("events.out.tfevents.*"))

    # The kept best checkpoint scores what was logged for it on the same sample.
    from transformer.inference.evaluation import score
    from transformer.inference.translator import Translator

    model, tokenizers, _ = load_trained_model(output, checkpoint="best")
    sources, references = fixed_sample(*zip(*[(s.decode(), t.decode()) for s, t in
                                               bible_tokenizers.corpus.validation.as_numpy_iterator()]), 12)
    assert score(Translator(tokenizers, model).translate(sources), references)["bleu"] == best["bleu"]


def test_early_stopping_after_patience_evaluations_without_a_new_best(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    sources, references = ["a b c d", "e f g h"], ["one two three four", "five six seven eight"]
    translator = ScriptedTranslator(references, [False, True, False, False, True])
    callback = ValidationBleu(lambda m: translator, sources, references, run_dir=tmp_path, every_steps=1, patience=2)
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=1, epochs=1, callbacks=[callback], verbose=0)
    bleus = [e["bleu"] for e in callback.report.evaluations]
    assert len(bleus) == 4 and bleus[1] == 100.0 and bleus[0] < 1 and bleus[2] < 1 and bleus[3] < 1
    assert callback.early_stopped and int(model.optimizer.iterations.numpy()) == 4
    assert json.loads((tmp_path / "best.json").read_text())["step"] == 2


def test_averaging_gives_the_mean_of_the_last_checkpoints(bible_tokenizers, tmp_path):
    config = run_config(bible_tokenizers, tmp_path).replace(
        model=ModelConfig(num_layers=1, d_model=16, num_heads=2, dff=32, max_length=16,
                          src_vocab_size=30, tgt_vocab_size=30))
    config.save(tmp_path / CONFIG_FILE)
    shutil.copytree(bible_tokenizers.directory, tmp_path / "tokenizers")  # a run directory holds its tokenizers
    model = build_model(config.model)
    checkpoints = RunCheckpoints(tmp_path / "checkpoints", model, compile_model(model, config), max_to_keep=3)
    saved = []
    for epoch in range(4):  # the first is dropped by max_to_keep and must not be averaged
        keras.utils.set_random_seed(epoch)
        for weight in model.weights:
            weight.assign(np.random.normal(size=weight.shape))
        saved.append([w.numpy() for w in model.weights])
        checkpoints.save(epoch + 1)
    average_checkpoints(tmp_path, last=2)
    averaged, _, _ = load_trained_model(tmp_path, checkpoint="averaged")
    for weight, third, fourth in zip(averaged.weights, saved[2], saved[3]):
        np.testing.assert_allclose(weight.numpy(), (third + fourth) / 2, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="checkpoint must be one of"):
        load_trained_model(tmp_path, checkpoint="nonsense")


def test_cosine_over_whole_epochs_plans_from_the_counted_batches(bible_tokenizers, tmp_path):
    """Without a budget or --steps-per-epoch, the cosine schedule's length is epochs × batches per epoch."""
    config = run_config(bible_tokenizers, tmp_path / "run", validation=False, epochs=2, steps_per_epoch=None,
                        lr_schedule="cosine", peak_learning_rate=1e-3, warmup_steps=2, bleu_sentences=0)
    config = config.replace(pipeline={"max_tokens": 4096})
    with tokenizers_reused(bible_tokenizers):
        result = train(config)
    steps = result.summary["optimizer_steps"]
    assert steps > 10 and result.summary["epochs_run"] == 2
    # Batches per epoch vary by a few (per-bucket remainders are dropped after each reshuffle),
    # so the schedule ends near, not exactly at, its floor; far from the 1e-3 peak either way.
    assert float(result.model.optimizer.learning_rate) < 0.05 * 1e-3
