"""Typed config (strict JSON round trip), CLI flag mapping, version and device checks."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_where_a_gpu_is_visible

from transformer.base import cli
from transformer.base.config import CorpusSpec, ModelConfig, RunConfig
from transformer.base.versions import VersionMismatchError, check_versions

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = REPO_ROOT / "scripts" / "train.py"


def load_train_script():
    """The train command (scripts/train.py runs its `main`)."""
    return importlib.import_module("transformer.commands.train")


def test_run_config_json_round_trip(tmp_path):
    config = RunConfig().replace(
        data={"data_dir": "/data/bible", "max_train_examples": 200},
        tokenizer={"vocab_size": 1000, "lower_case": False},
        model={"num_layers": 2, "d_model": 32, "head_width": "paper", "dropout_rate": 0.25},
        pipeline={"kind": "naive", "max_tokens": None},
        train={"epochs": 3, "mixed_precision": "bfloat16", "xla": True, "label_smoothing": 0.1},
    )
    path = tmp_path / "run" / "config.json"
    config.save(path)
    loaded = RunConfig.load(path)
    assert loaded == config
    assert loaded != RunConfig()
    assert json.loads(path.read_text())["model"]["head_width"] == "paper"
    assert RunConfig.from_dict({}) == RunConfig()  # missing keys keep the defaults


def test_replace_does_not_mutate_the_original():
    base = RunConfig()
    changed = base.replace(model={"d_model": 64})
    assert base.model.d_model == ModelConfig().d_model and changed.model.d_model == 64


@pytest.mark.parametrize("values,key", [
    ({"modle": {}}, "modle"),
    ({"model": {"d_modle": 64}}, "d_modle"),
    ({"train": {"epochs": 1, "lr": 0.1}}, "lr"),
])
def test_unknown_keys_are_errors_naming_the_key(values, key):
    with pytest.raises(KeyError, match=key):
        RunConfig.from_dict(values)


@pytest.mark.parametrize("values,key", [
    ({"model": {"d_model": "128"}}, "model.d_model"),
    ({"model": {"num_layers": True}}, "model.num_layers"),
    ({"model": {"dropout_rate": "0.1"}}, "model.dropout_rate"),
    ({"train": {"xla": 1}}, "train.xla"),
    ({"pipeline": {"max_tokens": 1.5}}, "pipeline.max_tokens"),
    ({"data": {"data_dir": 3}}, "data.data_dir"),
    ({"tokenizer": []}, "tokenizer"),
])
def test_wrong_types_are_errors_naming_the_key(values, key):
    with pytest.raises(TypeError, match=key.replace(".", r"\.")):
        RunConfig.from_dict(values)


def test_ints_are_accepted_for_floats_and_none_for_optionals():
    config = RunConfig.from_dict({"model": {"dropout_rate": 0}, "pipeline": {"max_tokens": None}})
    assert config.model.dropout_rate == 0.0 and isinstance(config.model.dropout_rate, float)
    assert config.pipeline.max_tokens is None


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.json"):
        RunConfig.load(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        RunConfig.load(bad)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"train": {"epocs": 2}}))
    with pytest.raises(KeyError, match="epocs"):
        RunConfig.load(typo)


@pytest.mark.parametrize("section,values,name", [
    ("model", {"head_width": "wide"}, "model.head_width"),
    ("model", {"head_width": "paper", "d_model": 30, "num_heads": 4}, "model.d_model"),
    ("model", {"dropout_rate": 1.0}, "model.dropout_rate"),
    ("pipeline", {"kind": "fast"}, "pipeline.kind"),
    ("pipeline", {"max_tokens": 0}, "pipeline.max_tokens"),
    ("train", {"mixed_precision": "fp8"}, "train.mixed_precision"),
    ("train", {"steps_per_epoch": 0}, "train.steps_per_epoch"),
    ("train", {"validation_steps": 0}, "train.validation_steps"),
    ("data", {"max_train_examples": 0}, "data.max_train_examples"),
    ("data", {"max_val_examples": -1}, "data.max_val_examples"),
    ("tokenizer", {"vocab_size": 0}, "tokenizer.vocab_size"),
])
def test_validate_rejects_bad_values_naming_the_field(section, values, name):
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        RunConfig().replace(**{section: values}).validate()


def test_flags_map_onto_the_config():
    script = load_train_script()
    args = script.parse_args([
        "--data", "some/dir", "--max-train-examples", "200", "--vocab-size", "1000", "--cased",
        "--tokenizers-root", "/tmp/tok", "--num-layers", "2", "--dropout", "0.2", "--head-width", "paper",
        "--pipeline", "naive", "--batch-size", "16", "--max-tokens", "0", "--epochs", "3",
        "--steps-per-epoch", "5", "--no-xla", "--mixed-precision", "bfloat16", "--output", "runs/x",
        "--resume", "--no-probe-peak", "--label", "exp",
    ])
    config = cli.run_config_from_args(args)
    assert config.data.corpora == (CorpusSpec("some/dir"),) and config.data.max_train_examples == 200
    assert config.tokenizer.vocab_size == 1000 and config.tokenizer.lower_case is False
    assert config.tokenizer.root == "/tmp/tok"
    assert (config.model.num_layers, config.model.dropout_rate, config.model.head_width) == (2, 0.2, "paper")
    assert config.pipeline.kind == "naive" and config.pipeline.batch_size == 16
    assert config.pipeline.max_tokens is None  # --max-tokens 0 → sentence batches
    assert (config.train.epochs, config.train.steps_per_epoch) == (3, 5)
    assert config.train.xla is False and config.train.mixed_precision == "bfloat16"
    assert config.train.output_dir == "runs/x" and config.train.resume is True
    assert config.train.probe_peak is False and config.train.label == "exp"


def test_unset_flags_keep_the_dataclass_defaults():
    script = load_train_script()
    assert cli.run_config_from_args(script.parse_args([])) == RunConfig()
    config = cli.run_config_from_args(script.parse_args(["--xla", "--max-tokens", "4096"]))
    assert config.train.xla is True and config.pipeline.max_tokens == 4096
    assert config.tokenizer.lower_case is False and config.train.resume is False  # the default recipe is cased
    assert cli.run_config_from_args(script.parse_args(["--lower-case"])).tokenizer.lower_case is True


def test_invalid_flag_values_fail():
    script = load_train_script()
    with pytest.raises(ValueError, match="model.dropout_rate"):
        cli.run_config_from_args(script.parse_args(["--dropout", "1.5"]))
    with pytest.raises(SystemExit):
        script.parse_args(["--head-width", "huge"])


def test_version_mismatch_names_the_fix():
    with pytest.raises(VersionMismatchError) as err:
        check_versions("2.21.0", "2.20.1")
    message = str(err.value)
    assert "2.21.0" in message and "2.20.1" in message
    assert "pip install 'tensorflow-text==2.21.*'" in message
    assert check_versions("2.21.0", "2.21.1") == ("2.21.0", "2.21.1")
    installed = check_versions()  # the venv is consistent
    assert installed[0].split(".")[:2] == installed[1].split(".")[:2]


def test_require_gpu_on_this_machine_lists_what_tensorflow_sees():
    import tensorflow as tf

    from transformer.runtime.devices import DeviceError, require_gpu

    skip_where_a_gpu_is_visible()
    with pytest.raises(DeviceError) as err:
        require_gpu()
    message = str(err.value)
    for device in tf.config.list_physical_devices():
        assert device.name in message
    assert "--device cpu" in message and tf.__version__ in message


def test_train_script_help_runs():
    result = subprocess.run([sys.executable, str(TRAIN_SCRIPT), "--help"], capture_output=True, text=True,
                            timeout=60, cwd=REPO_ROOT, env=cli.subprocess_env())
    assert result.returncode == 0, result.stderr
    for flag in ("--data", "--max-tokens", "--xla", "--no-xla", "--cased", "--resume", "--head-width"):
        assert flag in result.stdout


@pytest.mark.parametrize("typed,value", [("auto", "auto"), ("AUTO", "auto"), ("8192", 8192), ("0", None)])
def test_max_tokens_flag_takes_a_number_zero_or_auto(typed, value):
    script = load_train_script()
    config = cli.run_config_from_args(script.parse_args(["--max-tokens", typed]))
    assert config.pipeline.max_tokens == value
    assert RunConfig().pipeline.max_tokens == "auto"  # the default: decided for the device


@pytest.mark.parametrize("typed,message", [
    ("abc", "argument --max-tokens: 'abc': expected a number of tokens (e.g. 8192), 0 for --batch-size "
            "sentences, or 'auto'"),
    ("1.5", "argument --max-tokens: '1.5': expected a number of tokens"),
])
def test_bad_max_tokens_values_are_errors_naming_the_flag(typed, message, capsys):
    script = load_train_script()
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args([f"--max-tokens={typed}"])
    assert exit_info.value.code == 2
    assert f"error: {message}" in capsys.readouterr().err


def test_lr_scaling_flags_map_onto_the_config_and_bad_values_fail(capsys):
    script = load_train_script()
    config = cli.run_config_from_args(script.parse_args(["--lr-scaling", "sqrt", "--lr-reference-tokens", "4096"]))
    assert (config.train.lr_scaling, config.train.lr_reference_tokens) == ("sqrt", 4096)
    assert config.train.lr_batch_factor is None  # applied when training resolves the batch
    assert RunConfig().train.lr_scaling == "auto" and RunConfig().train.lr_reference_tokens == 2048
    with pytest.raises(SystemExit):
        script.parse_args(["--lr-scaling", "linear"])
    assert "error: argument --lr-scaling: invalid choice: 'linear'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"train\.lr_reference_tokens must be > 0.*\(flag --lr-reference-tokens\)"):
        cli.run_config_from_args(script.parse_args(["--lr-reference-tokens", "0"]))


def test_batch_fields_round_trip_and_older_config_files_still_load(tmp_path):
    for config in (RunConfig(),  # max_tokens "auto", not resolved yet
                   RunConfig().replace(pipeline={"max_tokens": 16384},  # as training saves it, resolved
                                       train={"lr_scaling": "sqrt", "lr_batch_factor": 8.0, "warmup_steps": 25,
                                              "peak_learning_rate": 1.4142e-3})):
        config.save(tmp_path / "config.json")
        assert RunConfig.load(tmp_path / "config.json") == config
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["pipeline"]["max_tokens"] == 16384 and saved["train"]["lr_batch_factor"] == 8.0
    for key in ("lr_scaling", "lr_reference_tokens", "lr_batch_factor"):  # written before these fields
        del saved["train"][key]
    saved["pipeline"]["max_tokens"] = 2048
    (tmp_path / "old.json").write_text(json.dumps(saved))
    old = RunConfig.load(tmp_path / "old.json").validate()
    assert old.pipeline.max_tokens == 2048 and old.train.lr_batch_factor is None
    with pytest.raises(ValueError, match=r"pipeline\.max_tokens must be a number of tokens or 'auto', got 'big'"):
        RunConfig.from_dict({"pipeline": {"max_tokens": "big"}}).validate()
    with pytest.raises(TypeError, match=r"pipeline\.max_tokens: expected int or str, got 1\.5"):
        RunConfig.from_dict({"pipeline": {"max_tokens": 1.5}})
    with pytest.raises(ValueError, match=r"train\.lr_scaling must be auto, sqrt or off"):
        RunConfig.from_dict({"train": {"lr_scaling": "linear"}}).validate()


def test_subword_flags_map_onto_the_config_and_round_trip(tmp_path):
    script = load_train_script()
    config = cli.run_config_from_args(script.parse_args(["--tokenizer", "sentencepiece", "--subword-alpha", "0.1",
                                                         "--subword-nbest", "-1"]))
    assert config.tokenizer.algorithm == "sentencepiece"
    assert (config.pipeline.subword_alpha, config.pipeline.subword_nbest) == (0.1, -1)
    assert config.pipeline.sampling == (-1, 0.1)
    config.save(tmp_path / "config.json")
    assert RunConfig.load(tmp_path / "config.json") == config
    default = cli.run_config_from_args(script.parse_args([]))
    assert default.tokenizer.algorithm == "wordpiece" and default.pipeline.sampling is None
    assert cli.run_config_from_args(script.parse_args(["--tokenizer", "sentencepiece"])).pipeline.sampling is None


@pytest.mark.parametrize("argv,message", [
    (["--subword-alpha", "0.1"], "pipeline.subword_alpha 0.1 samples segmentations of a SentencePiece model; the "
                                 "tokenizer is wordpiece (add --tokenizer sentencepiece, or drop --subword-alpha) "
                                 "(flag --subword-alpha)"),
    (["--tokenizer", "sentencepiece", "--subword-alpha", "-0.5"], "pipeline.subword_alpha must be >= 0"),
    (["--tokenizer", "sentencepiece", "--subword-alpha", "nan"], "pipeline.subword_alpha must be >= 0"),
    (["--tokenizer", "sentencepiece", "--subword-alpha", "0.1", "--subword-nbest", "1"],
     "pipeline.subword_nbest must be -1 (the whole lattice) or >= 2, got 1 (flag --subword-nbest)"),
])
def test_bad_subword_flags_are_errors_naming_the_flag(argv, message):
    script = load_train_script()
    with pytest.raises(cli.ConfigError) as caught:
        cli.run_config_from_args(script.parse_args(argv))
    assert message in str(caught.value)


def test_unknown_tokenizer_is_an_argparse_error(capsys):
    script = load_train_script()
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args(["--tokenizer", "bpe"])
    assert exit_info.value.code == 2
    assert "error: argument --tokenizer: invalid choice: 'bpe'" in capsys.readouterr().err


def test_config_files_without_the_subword_fields_load_as_wordpiece(tmp_path):
    values = RunConfig().to_dict()
    del values["tokenizer"]["algorithm"], values["pipeline"]["subword_alpha"], values["pipeline"]["subword_nbest"]
    (tmp_path / "config.json").write_text(json.dumps(values))
    loaded = RunConfig.load(tmp_path / "config.json")
    assert loaded.tokenizer.algorithm == "wordpiece" and loaded.pipeline.sampling is None


def test_every_command_lets_tensorflow_take_gpu_memory_as_needed(monkeypatch):
    """cli.start() (every command, before TensorFlow starts) turns GPU memory growth on; a value set wins.
    Without it a decoding process beside a training run or a test worker takes the whole GPU."""
    from transformer.base import cli

    monkeypatch.setattr(cli, "check_versions", lambda: None)
    monkeypatch.delenv(cli.GPU_GROWTH_ENV, raising=False)
    cli.start()
    assert os.environ[cli.GPU_GROWTH_ENV] == "true"
    monkeypatch.setenv(cli.GPU_GROWTH_ENV, "false")
    cli.start()
    assert os.environ[cli.GPU_GROWTH_ENV] == "false"


def test_model_dtype_reads_an_exports_manifest_without_tensorflow(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "translator.json").write_text('{"dtype": "bfloat16", "decode": {}}')
    assert cli.model_dtype(export) == "bfloat16"
    (export / "translator.json").write_text('{"decode": {}}')  # written before export.py --dtype existed
    assert cli.model_dtype(export) == "float32"
    (export / "translator.json").write_text("{not json")  # loading the model reports it, not this
    assert cli.model_dtype(export) == "float32"
    assert cli.model_dtype(tmp_path / "a-run-directory") == "float32"
