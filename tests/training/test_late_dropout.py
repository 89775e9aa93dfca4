"""`--dropout-from-epoch E`: a run trains epochs 1..E-1 without dropout, then with it."""

import keras
import pytest
from conftest import run_config

from transformer.base import cli
from transformer.base.config import TrainConfig
from transformer.base.errors import ConfigError
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
    """The default: the model's dropout from the first step, no switch in the graph."""
    config = run_config(bible_tokenizers, tmp_path / "run", validation=False, epochs=1, steps_per_epoch=1)
    assert config.train.dropout_from_epoch == TrainConfig.dropout_from_epoch == 1
    model = train(config).model
    assert all(layer.dropout_switch is None for layer in model._flatten_layers() if isinstance(layer, FastDropout))


@pytest.mark.parametrize("value", ["0", "-2"])
def test_bad_flag_names_it(value):
    with pytest.raises(ConfigError, match=r"train\.dropout_from_epoch must be an integer >= 1.*--dropout-from-epoch"):
        cli.run_config_from_args(parse_args(["--dropout-from-epoch", value]))
