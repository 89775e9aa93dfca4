"""`--profile-steps A:B`: a profiler trace of the chosen steps and its op-category breakdown."""

import json

import keras
import pytest
from conftest import run_config, tokenizers_reused

from transformer.base import cli
from transformer.base.config import TrainConfig, parse_profile_steps
from transformer.measure.compare import compare
from transformer.training.profiling import CATEGORIES, categorize
from transformer.training.trainer import train


@pytest.mark.parametrize("name, op_type, category", [
    ("transformer_1/decoder_0_1/self_attention_1/einsum/Einsum", "_MklEinsum", "matmul"),
    ("gradient_tape/transformer_1/logits_1/Tensordot/MatMul/MatMul_1", "_MklMatMul", "matmul"),
    ("transformer_1/decoder_0_1/self_attention_1/Softmax", "_MklSoftmax", "softmax"),
    ("transformer_1/encoder_0_1/self_attention_1/SelectV2", "SelectV2", "softmax"),  # the mask
    ("transformer_1/encoder_0_1/self_attention_1/query_1/add", "AddV2", "other"),  # a projection's bias
    ("transformer_1/encoder_1_1/attention_norm_1/moments/SquaredDifference", "SquaredDifference", "layer_norm"),
    ("gradient_tape/transformer_1/encoder_1_1/attention_norm_1/Cast_1/Cast", "Cast", "cast"),
    ("transformer_1/encoder_0_1/ffn_1/dropout_1/stateless_dropout/stateless_random_uniform/"
     "StatelessRandomUniformV2", "StatelessRandomUniformV2", "dropout"),
    ("gradient_tape/transformer_1/encoder_1_1/ffn_1/dropout_1_1/stateless_dropout/SelectV2", "SelectV2", "dropout"),
    ("transformer_1/tgt_embedding_1/token_embedding_1/GatherV2", "GatherV2", "embedding"),
    ("compile_loss/masked_cross_entropy/softmax_cross_entropy_with_logits", "SoftmaxCrossEntropyWithLogits", "loss"),
    ("StatefulPartitionedCall/adam/Sub_207/ReadVariableOp", "ReadVariableOp", "optimizer"),
    ("transformer_1/encoder_0_1/add", "AddV2", "other"),
])
def test_ops_fall_in_their_category(name, op_type, category):
    assert categorize(name, op_type) == category


@pytest.mark.parametrize("text", ["5:2", "0:3", "3", "a:b", "2:", "-1:2"])
def test_invalid_profile_steps_are_rejected(text, capsys):
    with pytest.raises(ValueError, match="A:B"):
        parse_profile_steps(text)
    with pytest.raises(ValueError, match="A:B"):
        TrainConfig(profile_steps=text).validate()
    parser = cli.argparse.ArgumentParser()
    cli.add_train_args(parser)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--profile-steps", text])
    assert exit_info.value.code == 2
    assert "--profile-steps" in capsys.readouterr().err
    assert parse_profile_steps("2:3") == (2, 3) and parse_profile_steps("4:4") == (4, 4)


def test_profiled_run_breaks_device_time_down_by_category(bible_tokenizers, tmp_path):
    output = tmp_path / "run"
    config = run_config(bible_tokenizers, output, validation=False, epochs=1, steps_per_epoch=3,
                        mixed_precision="bfloat16", profile_steps="2:3", bleu_sentences=0)
    with tokenizers_reused(bible_tokenizers):
        train(config)
    assert keras.mixed_precision.global_policy().name == "float32"  # train() restores the caller's policy
    report = json.loads((output / "report.json").read_text())
    profile = report["profile"]
    assert profile["steps"] == [2, 3] and profile["steps_profiled"] == 2
    assert (output / profile["trace"]).is_file() and profile["trace"].endswith(".xplane.pb")
    assert str(output / "tensorboard" / "plugins" / "profile") in str(output / profile["trace"])
    categories = profile["categories"]
    assert list(categories) == list(CATEGORIES)
    assert sum(c["seconds"] for c in categories.values()) == pytest.approx(profile["device_time_s"])
    assert sum(c["share"] for c in categories.values()) == pytest.approx(1.0)
    assert profile["device_time_s"] > 0 and profile["wall_s"] > 0
    for name in ("matmul", "softmax", "layer_norm", "dropout", "cast", "loss", "optimizer"):
        assert categories[name]["seconds"] > 0, name  # a bf16 step with dropout has all of these
    assert profile["top_ops"][0]["seconds"] >= profile["top_ops"][-1]["seconds"]
    assert {op["category"] for op in profile["top_ops"]} <= set(CATEGORIES)

    table = compare([output / "report.json", output / "report.json"])
    assert "| matmul % |" in table and f"| {report['run']['label']} | 2-3 |" in table
