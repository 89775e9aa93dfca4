"""Honest wall time under a budget: `--budget-clock wall` ends the run on time, evaluations
follow the budget-fraction schedule (validation loss + BLEU on one fixed sample), and the
progress display counts against the budget instead of Keras' `Epoch 2/1000000` bar."""

import io
import json
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import run_config, tokenizers_reused
from helpers_model import TINY_MODEL, build
from helpers_translation import ScriptedTranslator

from transformer.base import cli
from transformer.base.config import RunConfig, TrainConfig
from transformer.model.optimizer import compile_model
from transformer.training.budget import TrainingClock
from transformer.training.progress import BudgetProgress
from transformer.training.trainer import train
from transformer.training.validation_bleu import ValidationBleu


def test_wall_clock_run_ends_within_its_budget_and_shows_budget_progress(bible_tokenizers, tmp_path, capsys):
    budget_min = 0.5  # 30 s of wall time: start-up, steps, evaluations and the final save included
    config = run_config(bible_tokenizers, tmp_path / "run", epochs=None, steps_per_epoch=4,
                        time_budget_minutes=budget_min, budget_clock="wall", lr_schedule="cosine",
                        peak_learning_rate=1e-3, warmup_steps=2, bleu_sentences=8, verbose=1)
    with tokenizers_reused(bible_tokenizers):
        result = train(config)
    summary = result.summary
    assert summary["stopped_by"] == "time budget" and summary["budget_clock"] == "wall"
    assert summary["wall_time_s"] <= budget_min * 60 + 3, summary["time_s"]
    assert summary["wall_time_s"] >= 0.6 * budget_min * 60  # not far below (the reserve assumes a cold evaluation)
    times = summary["time_s"]
    assert times["evaluation"] > 0 and times["checkpoints"] > 0 and times["startup"] > 0
    assert times["training_steps"] + times["evaluation"] + times["checkpoints"] < summary["wall_time_s"]

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    evaluations = report["evaluations"]
    assert 2 <= len(evaluations) <= 3  # at 0.5 and 0.8 of the budget (unless one step spans both), and the end
    assert evaluations[-1]["step"] == summary["optimizer_steps"]
    assert all(e["val_loss"] > 0 and 0 <= e["val_masked_accuracy"] <= 1 and e["eval_s"] > 0 for e in evaluations)
    assert summary["val_loss"] == evaluations[-1]["val_loss"]
    assert report["run"]["time_s"] == times and report["run"]["budget_clock"] == "wall"
    assert float(result.model.optimizer.learning_rate) == pytest.approx(0.0, abs=1e-6)  # cosine reached its end

    out = capsys.readouterr().out
    assert "budget " in out and f"/{budget_min:.1f} min (wall)" in out and "ETA" in out and "tgt tok/s" in out
    assert "1000000" not in out and "Unknown" not in out and "Epoch " not in out


class Progress(keras.callbacks.Callback):
    """Stands in for a TrainingClock: progress = step / steps."""

    def __init__(self, clock, steps):
        super().__init__()
        self.clock, self.steps = clock, steps

    def on_train_batch_end(self, batch, logs=None):
        self.clock.progress.assign(int(self.model.optimizer.iterations.numpy()) / self.steps)


def test_evaluations_follow_the_budget_fractions_and_the_end(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    sources, references = ["a b c d"], ["one two three four"]
    clock = TrainingClock(budget_s=100.0)
    callback = ValidationBleu(lambda m: ScriptedTranslator(references, [True] * 5), sources, references,
                              clock=clock, fractions=(0.5, 0.8))
    model.fit(np.zeros((10, 2)), np.zeros((10, 1)), batch_size=1, epochs=1, verbose=0,
              callbacks=[Progress(clock, 10), callback])
    assert [e["step"] for e in callback.report.evaluations] == [5, 8, 10]
    assert clock.end_costs["evaluation"] > 0  # the wall clock's reserve learns from it


def test_progress_line_counts_against_the_budget():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    clock = TrainingClock(budget_s=600.0)
    stream = io.StringIO()
    evaluator = types.SimpleNamespace(fractions=[0.5])  # one scheduled evaluation to come, and the final one
    progress = BudgetProgress(clock, evaluator=evaluator, in_place=False, every_s=0, stream=stream)
    clock.expect_at_end("evaluation", 30.0)
    model.fit(np.zeros((4, 2)), np.zeros((4, 1)), batch_size=1, epochs=2, verbose=0, callbacks=[clock, progress])
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("budget 0.0/10.0 min (train) · step 1 · epoch 1") and "loss 0.000" in lines[0]
    assert "epoch 2 done" in lines[-2] and "step 8" in lines[-1]
    eta = progress.eta_s()  # training left + the two evaluations to come (train clock: they come on top)
    assert 600 - clock.seconds + 2 * 30 == pytest.approx(eta, abs=0.01)
    assert "ETA 11 min" in lines[-1]
    wall = TrainingClock(budget_s=600.0, wall=True)
    assert BudgetProgress(wall).eta_s() == pytest.approx(600.0, abs=1.0)  # the budget left, reserve included


def test_budget_flags():
    import argparse

    parser = argparse.ArgumentParser()
    cli.add_train_args(parser)
    config = cli.run_config_from_args(parser.parse_args(["--budget-clock", "wall", "--eval-at", "0.25,0.9"]))
    assert config.train.budget_clock == "wall" and config.train.eval_at == (0.25, 0.9)
    assert cli.run_config_from_args(parser.parse_args(["--eval-at", "end"])).train.eval_at == ()
    for bad in ("0.9,0.5", "1.5", "half"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--eval-at", bad])


def test_validation_loss_is_the_token_weighted_mean_over_batches_of_any_shape_traced_once():
    """`loss_batches` of different shapes: one trace, and the loss / accuracy of all their real
    target tokens together (pad tokens count in neither)."""
    model = build(TINY_MODEL)
    compile_model(model, RunConfig(model=TINY_MODEL, train=TrainConfig(mixed_precision="off", xla=False,
                                                                       lr_schedule="inverse-sqrt", label_smoothing=0.0)))
    rng = np.random.default_rng(0)
    batches = []
    for rows, src_len, tgt_len in ((3, 5, 7), (2, 9, 4), (4, 6, 6)):
        src = rng.integers(4, TINY_MODEL.src_vocab_size, (rows, src_len)).astype("int32")
        tgt = rng.integers(4, TINY_MODEL.tgt_vocab_size, (rows, tgt_len + 1)).astype("int32")
        tgt[0, tgt_len - 1:] = 0  # a padded row
        batches.append(((src, tgt[:, :-1]), tgt[:, 1:]))
    dataset = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=(
        (tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)), tf.TensorSpec([None, None], tf.int32)))
    callback = ValidationBleu(lambda m: ScriptedTranslator(["x"], [True]), ["a"], ["x"], loss_batches=dataset)
    callback.set_model(model)
    loss, accuracy = callback._validation_loss()
    assert callback._validation_loss() == (loss, accuracy) and callback._loss_step.experimental_get_tracing_count() == 1
    losses, hits = [], []
    for inputs, target in batches:
        logits = model(inputs, training=False)
        real = target != 0
        log_probs = tf.nn.log_softmax(logits).numpy()
        losses.append(-np.take_along_axis(log_probs, target[..., None], -1)[..., 0][real])
        hits.append((logits.numpy().argmax(-1) == target)[real])
    assert loss == pytest.approx(np.concatenate(losses).mean(), abs=1e-4)
    assert accuracy == pytest.approx(np.concatenate(hits).mean(), abs=1e-4)
