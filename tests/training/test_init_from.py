"""`--init-from RUN`: a new run that starts from another run's weights (fine-tuning).

The weights it starts from are RUN's; its tokenizers are copied from RUN (none built); its
step count, optimizer and schedule are its own; config.json records the start; fine-tuning on
a shifted corpus lowers the loss on that corpus below the un-fine-tuned model's.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_RUN_STEPS, script_main

from transformer.base import cli
from transformer.base.config import RunConfig
from transformer.base.errors import ArtifactError, ConfigError
from transformer.data.pipeline import make_batches
from transformer.inference.rundir import CONFIG_FILE, TOKENIZER_DIR, load_trained_model
from transformer.model.losses import MaskedSparseCrossEntropy

FINE_TUNE_STEPS = 80
SHIFTED_PAIRS = 48


class WeightsAtStart(keras.callbacks.Callback):
    """Keeps the model's weights and the optimizer's state as `fit` begins (before the first step)."""

    def on_train_begin(self, logs=None):
        self.weights = [w.numpy() for w in self.model.weights]
        self.optimizer = [v.numpy() for v in self.model.optimizer.variables]


def shifted_corpus(bible_tokenizers, directory):
    """Pairs the first run never saw, with a mapping it never learned: each English target's words
    reversed ("in the beginning god created" → "created god beginning the in"). Files B.pt / B.en."""
    directory.mkdir(parents=True, exist_ok=True)
    pairs = [(s.decode(), t.decode()) for s, t in bible_tokenizers.corpus.validation.as_numpy_iterator()]
    pairs = [(s, " ".join(reversed(t.split()[:12]))) for s, t in pairs[:SHIFTED_PAIRS]]
    (directory / "B.pt").write_text("".join(s + "\n" for s, _ in pairs))
    (directory / "B.en").write_text("".join(t + "\n" for _, t in pairs))
    return directory / "B", pairs


def mean_token_loss(run_dir, pairs) -> float:
    """The run's latest weights' cross-entropy (no smoothing) per target token over `pairs`."""
    model, tokenizers, config = load_trained_model(run_dir)
    batches = make_batches(tf.data.Dataset.from_tensor_slices(tuple(map(list, zip(*pairs)))), tokenizers,
                           config.pipeline, config.model.max_length, training=False)
    loss, total, tokens = MaskedSparseCrossEntropy(0.0), 0.0, 0.0
    for inputs, target in batches:
        count = float(tf.reduce_sum(tf.cast(target != 0, tf.float32)))
        total += float(loss(target, model(inputs, training=False))) * count
        tokens += count
    return total / tokens


def fine_tune_argv(prefix, run, output, *extra) -> list[str]:
    return ["--train-src", f"{prefix}.pt", "--train-tgt", f"{prefix}.en", "--init-from", str(run),
            "--epochs", "1", "--steps-per-epoch", str(FINE_TUNE_STEPS), "--max-tokens", "256",
            "--lr-schedule", "cosine", "--peak-lr", "5e-3", "--warmup-steps", "5", "--dropout", "0",
            "--bleu-sentences", "0", "--device", "cpu", "--mixed-precision", "off", "--no-xla",
            "--no-probe-peak", "--verbose", "0", "--output", str(output), *extra]


@pytest.fixture(scope="module")
def fine_tuned(tiny_run, bible_tokenizers, tmp_path_factory):
    """(tiny_run fine-tuned on the shifted corpus B for FINE_TUNE_STEPS steps, B's pairs, tokenizers root)."""
    root = tmp_path_factory.mktemp("fine-tune")
    prefix, pairs = shifted_corpus(bible_tokenizers, root / "data")
    output = root / "run"
    assert script_main("train")(fine_tune_argv(prefix, tiny_run, output,
                                               "--tokenizers-root", str(root / "no-tokenizers"))) == 0
    return output, pairs, root / "no-tokenizers"


def test_fine_tuning_lowers_the_loss_on_the_shifted_corpus(tiny_run, fine_tuned):
    output, pairs, _ = fine_tuned
    before, after = mean_token_loss(tiny_run, pairs), mean_token_loss(output, pairs)
    # 80 steps on 48 pairs: measured 6.56 → 4.37 nats per token (seeded, float32 on CPU).
    assert after < before - 1.0, (before, after)


def test_the_new_run_is_its_own_run_and_records_its_start(tiny_run, fine_tuned):
    output, _, tokenizers_root = fine_tuned
    config = RunConfig.load(output / CONFIG_FILE)
    source = RunConfig.load(tiny_run / CONFIG_FILE)
    assert config.train.init_from == str(tiny_run) and config.train.init_checkpoint == "latest"
    assert config.train.init_from_step == TINY_RUN_STEPS
    assert config.model == source.model.__class__(**{**source.model.__dict__, "dropout_rate": 0.0})
    assert config.tokenizer.vocab_size == source.tokenizer.vocab_size
    summary = json.loads((output / "summary.json").read_text())
    assert summary["optimizer_steps"] == FINE_TUNE_STEPS  # its own step count, from 0
    # the tokenizers are RUN's, copied (self-contained), none built
    copied, original = output / TOKENIZER_DIR, tiny_run / TOKENIZER_DIR
    assert sorted(p.relative_to(copied) for p in copied.rglob("*")) == sorted(p.relative_to(original)
                                                                             for p in original.rglob("*"))
    assert (copied / "manifest.json").read_bytes() == (original / "manifest.json").read_bytes()
    assert not tokenizers_root.exists()


def test_training_starts_from_the_runs_weights(tiny_run, bible_tokenizers, tmp_path):
    from transformer.training.trainer import train

    prefix, _ = shifted_corpus(bible_tokenizers, tmp_path / "data")
    args = cli.run_config_from_args(_parse(fine_tune_argv(prefix, tiny_run, tmp_path / "run", "--steps-per-epoch", "1",
                                                          "--init-checkpoint", "latest")))
    start = WeightsAtStart()
    train(args, extra_callbacks=(start,))
    source, _, _ = load_trained_model(tiny_run)
    assert len(start.weights) == len(source.weights)
    for loaded, saved in zip(start.weights, source.weights):
        np.testing.assert_array_equal(loaded, saved.numpy())
    # a new optimizer: step 0, Adam's moments zero (not RUN's, which its checkpoint holds too)
    assert len(start.optimizer) > 2 and all(not np.any(v) for v in start.optimizer if v.ndim), start.optimizer[:2]
    assert int(start.optimizer[0]) == 0


def test_an_earlier_checkpoint_can_be_chosen(tiny_run, bible_tokenizers, tmp_path):
    """--init-checkpoint PREFIX: the step-2 checkpoint, and its step recorded."""
    from transformer.training.init_from import open_init_source

    earlier = sorted((tiny_run / "checkpoints").glob("ckpt-*.index"))[0].with_suffix("")
    config = RunConfig.load(tiny_run / CONFIG_FILE).replace(train={"init_from": str(tiny_run),
                                                                   "init_checkpoint": str(earlier)})
    assert open_init_source(config).step == 2


def _parse(argv):
    from transformer.commands.train import parse_args

    return parse_args(argv)


def test_contradicting_flags_are_listed_with_both_values(tiny_run, tmp_path):
    argv = ["--init-from", str(tiny_run), "--output", str(tmp_path / "o"), "--num-layers", "3", "--d-model", "64",
            "--cased", "--num-heads", "2", "--dropout", "0.3"]
    with pytest.raises(ConfigError) as caught:
        cli.run_config_from_args(_parse(argv))
    message = str(caught.value)
    assert message.startswith(f"--init-from {tiny_run}: 3 flag(s) contradict"), message
    for typed, saved in (("--num-layers 3", "model.num_layers = 1"), ("--d-model 64", "model.d_model = 16"),
                         ("--cased", "tokenizer.lower_case = True")):
        assert f"{typed} (the run has {saved})" in message, message
    assert "--num-heads" not in message and "--dropout" not in message  # agrees / its own


def test_agreeing_flags_take_the_runs_architecture_and_their_own_dropout(tiny_run, tmp_path):
    config = cli.run_config_from_args(_parse(["--init-from", str(tiny_run), "--output", str(tmp_path / "o"),
                                              "--num-heads", "2", "--dropout", "0.3"]))
    saved = RunConfig.load(tiny_run / CONFIG_FILE)
    assert config.model.d_model == saved.model.d_model == 16 and config.model.dropout_rate == 0.3
    assert config.model.src_vocab_size == saved.model.src_vocab_size
    assert config.tokenizer.vocab_size == saved.tokenizer.vocab_size


@pytest.mark.parametrize("damage, message", [
    ("missing", "run directory not found"),
    ("config", "config.json is missing or damaged"),
    ("checkpoints", "no latest checkpoint in"),
    ("data", "is damaged"),
])
def test_a_missing_or_damaged_run_is_named(tiny_run, tmp_path, damage, message):
    import shutil

    from transformer.training.init_from import open_init_source

    run = tmp_path / "source"
    if damage != "missing":
        shutil.copytree(tiny_run, run)
    if damage == "config":
        (run / CONFIG_FILE).write_text("{not json")
    elif damage == "checkpoints":
        shutil.rmtree(run / "checkpoints")
    elif damage == "data":
        latest = tf.train.latest_checkpoint(str(run / "checkpoints"))
        data = next(run.glob(f"checkpoints/{latest.rsplit('/', 1)[-1]}.data-*"))
        data.write_bytes(data.read_bytes()[:64])
    config = RunConfig.load(tiny_run / CONFIG_FILE).replace(train={"init_from": str(run)})
    with pytest.raises((ArtifactError, FileNotFoundError)) as caught:
        if damage in ("missing", "config"):
            cli.apply_init_from(config, {})
        open_init_source(config)
        from transformer.inference.rundir import build_model

        open_init_source(config).load_weights(build_model(config.model))
    assert str(caught.value).startswith(f"--init-from {run}: "), caught.value
    assert message in str(caught.value), caught.value


def test_resuming_a_fine_tuned_run_continues_from_its_own_checkpoint(tiny_run, fine_tuned, tmp_path):
    """The crashed-run command again with --resume: the fine-tuned run's weights and step, not RUN's."""
    import shutil

    from transformer.training.trainer import train

    output, _, tokenizers_root = fine_tuned
    run = tmp_path / "run"
    shutil.copytree(output, run)  # the module's fine-tuned run stays as it is
    prefix = output.parent / "data" / "B"
    argv = fine_tune_argv(prefix, tiny_run, run, "--tokenizers-root", str(tokenizers_root), "--epochs", "2",
                          "--resume")
    start = WeightsAtStart()
    train(cli.run_config_from_args(_parse(argv)), extra_callbacks=(start,))
    fine, _, _ = load_trained_model(output)
    source, _, _ = load_trained_model(tiny_run)
    for loaded, saved in zip(start.weights, fine.weights):
        np.testing.assert_array_equal(loaded, saved.numpy())
    assert any(not np.array_equal(a, b.numpy()) for a, b in zip(start.weights, source.weights))
    assert int(start.optimizer[0]) == FINE_TUNE_STEPS  # the optimizer's state came back too
    config = RunConfig.load(run / CONFIG_FILE)
    assert config.train.init_from == str(tiny_run) and config.train.init_from_step == TINY_RUN_STEPS
    assert json.loads((run / "summary.json").read_text())["optimizer_steps"] == 2 * FINE_TUNE_STEPS
