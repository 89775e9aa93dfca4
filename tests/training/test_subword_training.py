"""Training with SentencePiece tokenizers and sampled segmentations (`--tokenizer sentencepiece
--subword-alpha A`): the run records both, and `--init-from` keeps the run's tokenizer kind."""

import json
import shutil

import pytest
from conftest import script_main
from helpers_translation import BIBLE_DIR, TOKENIZER_PAIRS, VAL_PAIRS, shared_tokenizers

from transformer.base import cli
from transformer.base.config import RunConfig
from transformer.base.errors import ConfigError
from transformer.commands.train import parse_args


def tiny_argv(output, *extra) -> list[str]:
    """scripts/train.py flags for 2 steps of a tiny model on the slice the SentencePiece test tokenizers were
    learned from (the training files named explicitly, as conftest's tiny_run: the same key, reused)."""
    _, _, config, _ = shared_tokenizers("sentencepiece")
    return ["--train-src", f"{BIBLE_DIR}/train.pt", "--train-tgt", f"{BIBLE_DIR}/train.en",
            "--max-train-examples", str(TOKENIZER_PAIRS), "--max-val-examples", str(VAL_PAIRS),
            "--vocab-size", str(config.vocab_size), "--lower-case", "--tokenizers-root", config.root,
            "--num-layers", "1", "--d-model", "16", "--num-heads", "2", "--dff", "32", "--max-length", "24",
            "--max-tokens", "256", "--epochs", "1", "--steps-per-epoch", "2", "--bleu-sentences", "0",
            "--device", "cpu", "--mixed-precision", "off", "--no-xla", "--no-probe-peak", "--verbose", "0",
            "--output", str(output), *extra]


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("subword") / "run"
    assert script_main("train")(tiny_argv(run, "--tokenizer", "sentencepiece", "--subword-alpha", "0.1")) == 0
    return run


def test_the_run_records_the_tokenizer_kind_and_the_sampling(sampled_run):
    config = RunConfig.load(sampled_run / "config.json")
    assert config.tokenizer.algorithm == "sentencepiece"
    assert config.pipeline.sampling == (64, 0.1)
    assert json.loads((sampled_run / "tokenizers" / "manifest.json").read_text())["algorithm"] == "sentencepiece"


def test_init_from_keeps_the_runs_tokenizer_kind(sampled_run, tmp_path):
    argv = ["--init-from", str(sampled_run), "--output", str(tmp_path / "a"), "--tokenizer", "wordpiece"]
    with pytest.raises(ConfigError) as caught:
        cli.run_config_from_args(parse_args(argv))
    assert "--tokenizer wordpiece (the run has tokenizer.algorithm = 'sentencepiece')" in str(caught.value)
    config = cli.run_config_from_args(parse_args(["--init-from", str(sampled_run), "--output", str(tmp_path / "b"),
                                                  "--subword-alpha", "0.2"]))
    assert config.tokenizer.algorithm == "sentencepiece" and config.pipeline.subword_alpha == 0.2


def test_init_from_a_wordpiece_run_refuses_sampling(tiny_run, tmp_path):
    argv = ["--init-from", str(tiny_run), "--output", str(tmp_path / "a"), "--subword-alpha", "0.1"]
    with pytest.raises(ConfigError, match=f"--init-from {tiny_run}: pipeline.subword_alpha 0.1 samples"):
        cli.run_config_from_args(parse_args(argv))


def test_resume_keeps_sampling_from_the_runs_tokenizers(sampled_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(sampled_run, run)
    argv = tiny_argv(run, "--subword-alpha", "0.1", "--resume", "--epochs", "2")  # no --tokenizer typed
    assert script_main("train")(argv) == 0
    config = RunConfig.load(run / "config.json")
    assert config.tokenizer.algorithm == "sentencepiece" and config.pipeline.subword_alpha == 0.1
