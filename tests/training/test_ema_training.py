"""`--ema-decay`: a run keeps the moving average of its weights beside them.

The run's latest checkpoint stays the raw weights; `<run>/ema/` holds the average that the
latest checkpoint's optimizer carries (`--checkpoint ema` loads it, `--init-checkpoint ema`
starts from it); `--resume` restores the shadows and continues the average (taking the run's
decay when the command line gives none, refusing a contradicting one).
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from conftest import run_config, script_main, tiny_train_argv
from helpers_model import moves_in_training

from transformer.base import cli
from transformer.base.errors import ConfigError
from transformer.commands.train import parse_args
from transformer.inference.rundir import CHECKPOINT_DIR, EMA_DIR, EMA_FILE, RunCheckpoints, build_model, load_trained_model
from transformer.model.optimizer import compile_model, make_schedule
from transformer.runtime import artifacts
from transformer.training.init_from import open_init_source
from transformer.training.trainer import train

DECAY, EVERY, STEPS = 0.9, 2, 5


@pytest.fixture(scope="module")
def ema_run(bible_tokenizers, tmp_path_factory):
    run = tmp_path_factory.mktemp("ema-run") / "run"
    argv = tiny_train_argv(bible_tokenizers, run, "--ema-decay", str(DECAY), "--ema-every", str(EVERY), steps=STEPS)
    assert script_main("train")(argv) == 0
    return run


def latest_state(run):
    """(raw weights, moving averages) of the run's latest checkpoint, in the model's weight order."""
    config = artifacts.load_run_config(run)
    model = build_model(config.model)
    optimizer = compile_model(model, config, make_schedule(config, config.model.d_model, total_steps=STEPS))
    RunCheckpoints(run / CHECKPOINT_DIR, model, optimizer).restore_latest()
    shadows = {id(v): s.numpy() for v, s in optimizer.moving_averages()}
    return [w.numpy() for w in model.weights], [shadows[id(w)] for w in model.weights], int(optimizer.iterations.numpy())


def test_ema_checkpoint_holds_the_average_and_latest_the_raw_weights(ema_run):
    raw, shadows, step = latest_state(ema_run)
    assert step == STEPS
    info = json.loads((ema_run / EMA_DIR / EMA_FILE).read_text())
    assert (info["step"], info["decay"], info["every"]) == (STEPS, DECAY, EVERY)
    averaged, _, _ = load_trained_model(ema_run, checkpoint="ema")
    latest, _, _ = load_trained_model(ema_run)
    for weight, shadow in zip(averaged.weights, shadows):
        np.testing.assert_array_equal(weight.numpy(), shadow)
    for weight, value in zip(latest.weights, raw):
        np.testing.assert_array_equal(weight.numpy(), value)
    trained = [(s, r) for s, r, weight in zip(shadows, raw, latest.weights) if moves_in_training(weight)]
    assert sum(not np.array_equal(s, r) for s, r in trained) == len(trained) > 0  # every trained weight: an average


def test_checkpoint_ema_translates_and_starts_a_fine_tuning_run(ema_run, tmp_path, capsys):
    assert script_main("translate")(["--model", str(ema_run), "--checkpoint", "ema", "Deus é amor."]) == 0
    assert capsys.readouterr().out.strip()
    config = cli.run_config_from_args(parse_args(["--init-from", str(ema_run), "--init-checkpoint", "ema",
                                                  "--output", str(tmp_path / "fine")]))
    source = open_init_source(config)
    assert source.prefix.startswith(str(ema_run / EMA_DIR)) and source.step == STEPS


def test_resume_with_a_contradicting_decay_is_refused(ema_run):
    with pytest.raises(ConfigError, match=r"--ema-decay 0\.99 \(the run has train\.ema_decay = 0\.9\)"):
        cli.run_config_from_args(parse_args(["--resume", "--output", str(ema_run), "--ema-decay", "0.99"]))


class WeightsAfterEachStep(keras.callbacks.Callback):
    """The trainable weights after every update, in the optimizer's order."""

    def __init__(self):
        super().__init__()
        self.after = []

    def on_train_batch_end(self, batch, logs=None):
        self.after.append([v.numpy().copy() for v, _ in self.model.optimizer.moving_averages()])


def test_resume_restores_and_continues_the_average(bible_tokenizers, tmp_path):
    """Epoch 1 (3 steps), then --resume for epoch 2 without --ema-decay: the run's decay is kept
    and the average continues from the checkpoint's: s ← d·s + (1−d)·θ at steps 3, 4, 5."""
    first = train(run_config(bible_tokenizers, tmp_path, validation=False, epochs=1, ema_decay=DECAY, ema_every=1))
    restored = [s.numpy().copy() for _, s in first.model.optimizer.moving_averages()]
    recorder = WeightsAfterEachStep()
    resumed = train(run_config(bible_tokenizers, tmp_path, validation=False, epochs=2, resume=True),
                    extra_callbacks=(recorder,))
    optimizer = resumed.model.optimizer
    assert int(optimizer.iterations.numpy()) == 6 and optimizer.ema_decay == DECAY
    expected = restored
    for t, weights in zip(range(3, 6), recorder.after):
        d = min(DECAY, (2 + t) / (11 + t))  # n = t + 1 updates
        expected = [d * s + (1 - d) * w for s, w in zip(expected, weights)]
    for (_, shadow), want in zip(optimizer.moving_averages(), expected):
        np.testing.assert_allclose(shadow.numpy(), want, rtol=0, atol=1e-6)
    assert json.loads((tmp_path / EMA_DIR / EMA_FILE).read_text())["step"] == 6


def test_benchmark_reports_every_variant(ema_run, tmp_path):
    report = tmp_path / "ema.json"
    assert script_main("benchmark_ema")(["--run", str(ema_run), "--mixed-precision", "off", "--every", "1", "3",
                                         "--rows", "2", "--length", "4", "--steps", "2", "--rounds", "2",
                                         "--output", str(report)]) == 0
    result = json.loads(report.read_text())
    assert list(result["variants"]) == ["no EMA", "EMA every 1", "EMA every 3"]
    assert all(v["steps"] == 2 and v["median_step_s"] > 0 for v in result["variants"].values())
    assert result["variants"]["no EMA"]["overhead_pct"] == 0
    assert all(t > 0 for t in result["update_alone_median_s"].values()) and result["shadow_variables"] > 0
