"""`--dropout-from-epoch E`: a run trains epochs 1..E-1 without dropout, then with it."""

import json

import keras
import pytest
from conftest import run_config

from transformer.base import cli
from transformer.base.config import RunConfig
from transformer.base.errors import ConfigError
from transformer.base.presets import preset
from transformer.commands.train import parse_args
from transformer.model.dropout import FastDropout
from transformer.training.trainer import train


class SwitchProbe(keras.callbacks.Callback):
    """Records (epoch, dropout on?) at every training step, read from the model's own dropout layers."""

    def __init__(self):
        super().__init__()
        self.epoch, self.seen = 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1

    def on_train_batch_begin(self, batch, logs=None):
        switches = {id(layer.dropout_switch): layer.dropout_switch for layer in self.model._flatten_layers()
                    if isinstance(layer, FastDropout)}
        assert len(switches) == 1 and None not in switches.values()  # every site, one switch
        self.seen.append((self.epoch, bool(next(iter(switches.values())).on.numpy())))


def test_dropout_is_off_before_the_epoch_and_on_from_it(bible_tokenizers, tmp_path):
    probe = SwitchProbe()
    config = run_config(bible_tokenizers, tmp_path / "run", validation=False, epochs=3, steps_per_epoch=2,
                        dropout_from_epoch=3)
    train(config, extra_callbacks=(probe,))
    assert probe.seen == [(1, False), (1, False), (2, False), (2, False), (3, True), (3, True)]


def test_from_epoch_1_attaches_nothing(bible_tokenizers, tmp_path):
    """Dropout from the first step (the tutorial's recipe): no switch in the graph."""
    config = run_config(bible_tokenizers, tmp_path / "run", validation=False, epochs=1, steps_per_epoch=1,
                        dropout_from_epoch=1)
    model = train(config).model
    assert all(layer.dropout_switch is None for layer in model._flatten_layers() if isinstance(layer, FastDropout))


def test_the_recipe_starts_dropout_late_and_the_tutorial_from_the_start():
    assert RunConfig().train.dropout_from_epoch > 1
    assert preset("tutorial").train.dropout_from_epoch == 1


def test_an_older_run_config_loads_with_dropout_from_the_start(tmp_path):
    """A config.json written before the field existed describes a run whose dropout ran from step 1."""
    values = RunConfig().to_dict()
    del values["train"]["dropout_from_epoch"]
    (tmp_path / "config.json").write_text(json.dumps(values))
    assert RunConfig.load(tmp_path / "config.json").train.dropout_from_epoch == 1
    RunConfig().replace(train={"dropout_from_epoch": 4}).save(tmp_path / "new.json")
    assert RunConfig.load(tmp_path / "new.json").train.dropout_from_epoch == 4


def test_resume_keeps_the_runs_epoch_and_refuses_a_contradicting_flag(tmp_path):
    RunConfig().replace(train={"dropout_from_epoch": 2, "output_dir": str(tmp_path)}).save(tmp_path / "config.json")
    with pytest.raises(ConfigError, match="dropout_from_epoch"):
        cli.run_config_from_args(parse_args(["--resume", "--output", str(tmp_path), "--dropout-from-epoch", "5"]))


@pytest.mark.parametrize("value", ["0", "-2"])
def test_bad_flag_names_it(value):
    with pytest.raises(ConfigError, match=r"train\.dropout_from_epoch must be an integer >= 1.*--dropout-from-epoch"):
        cli.run_config_from_args(parse_args(["--dropout-from-epoch", value]))
