"""`--profile-steps A:B`: a profiler trace of the chosen steps and its op-category breakdown."""

import csv
import json

import keras
import pytest
from conftest import run_config, tokenizers_reused

from transformer.base import cli
from transformer.base.config import TrainConfig, parse_profile_steps
from transformer.measure.compare import compare
from transformer.training.profiling import (
    CATEGORIES,
    categorize,
    gpu_breakdown,
    op_breakdown,
    per_target_token,
    profile_breakdown,
)
from transformer.training.trainer import train


@pytest.mark.parametrize("name, op_type, category", [
    ("transformer_1/decoder_0_1/self_attention_1/einsum/Einsum", "_MklEinsum", "matmul"),
    ("gradient_tape/transformer_1/logits_1/Tensordot/MatMul/MatMul_1", "_MklMatMul", "matmul"),
    ("gradient_tape/transformer_1/encoder_0_1/self_attention_1/SmallBatchMatMul_1", "SmallBatchMatMul", "matmul"),
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
                        mixed_precision="bfloat16", profile_steps="2:3", bleu_sentences=0,
                        dropout_from_epoch=1)  # dropout in the profiled steps
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
    with open(output / report["steps_csv"]) as rows:
        tokens = [int(row["tgt_tokens"]) for row in csv.DictReader(rows)]
    assert profile["tgt_tokens"] == sum(tokens[1:3]) > 0  # steps 2-3 (1-based): rows 1 and 2
    per_token = profile["us_per_tgt_token"]
    assert per_token["matmul"] == pytest.approx(1e6 * categories["matmul"]["seconds"] / profile["tgt_tokens"])
    assert profile["non_matmul_us_per_tgt_token"] == pytest.approx(
        profile["device_us_per_tgt_token"] - per_token["matmul"])
    assert {op["category"] for op in profile["top_ops"]} <= set(CATEGORIES)

    table = compare([output / "report.json", output / "report.json"])
    assert "| matmul % |" in table and f"| {report['run']['label']} | 2-3 |" in table


def _gpu_trace():
    """An XSpace as the profiler writes it on a GPU: host op events, and one GPU plane with two
    streams (kernels with `tf_op` stats, one by reference) plus a derived line to be ignored."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    host = space.planes.add(name="/host:CPU")
    host.event_metadata[1].name = "transformer_1/encoder_0_1/ffn_1/dense/MatMul:MatMul"
    host.lines.add(name="tf_Compute").events.add(metadata_id=1, offset_ps=0, duration_ps=5_000_000)
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.event_metadata[1].name = "ampere_bf16_s16816gemm"
    gpu.event_metadata[2].name = "softmax_kernel"
    gpu.stat_metadata[7].name = "tf_op"
    gpu.stat_metadata[8].name = "transformer_1/decoder_0_1/self_attention_1/Softmax:Softmax"
    stream = gpu.lines.add(name="Stream #13(Compute)", timestamp_ns=1_000)
    # kernels at [0, 4) and [10, 12) µs; the second stream overlaps the first one at [2, 6) µs
    gemm = stream.events.add(metadata_id=1, offset_ps=0, duration_ps=4_000_000)
    gemm.stats.add(metadata_id=7, str_value="transformer_1/encoder_0_1/ffn_1/dense/MatMul:MatMul")
    softmax = stream.events.add(metadata_id=2, offset_ps=10_000_000, duration_ps=2_000_000)
    softmax.stats.add(metadata_id=7, ref_value=8)
    other = gpu.lines.add(name="Stream #14(Memcpy)", timestamp_ns=1_000)
    other.events.add(metadata_id=2, offset_ps=2_000_000, duration_ps=4_000_000)  # no tf_op: "other"
    derived = gpu.lines.add(name="TensorFlow Ops", timestamp_ns=1_000)
    derived.events.add(metadata_id=1, offset_ps=0, duration_ps=12_000_000)
    return space


def test_gpu_breakdown_counts_kernels_busy_time_and_host_gaps():
    gpu = gpu_breakdown(_gpu_trace(), steps=2)
    assert gpu["kernels"] == 3 and gpu["kernels_per_step"] == 1.5
    assert gpu["span_s"] == pytest.approx(12e-6)  # first kernel start to last kernel end
    assert gpu["busy_s"] == pytest.approx(8e-6)  # [0, 6) ∪ [10, 12)
    assert gpu["idle_share"] == pytest.approx(1 / 3)
    assert gpu["kernel_time_s"] == pytest.approx(10e-6)
    seconds = {name: value["seconds"] for name, value in gpu["categories"].items()}
    assert seconds["matmul"] == pytest.approx(4e-6) and seconds["softmax"] == pytest.approx(2e-6)
    assert seconds["other"] == pytest.approx(4e-6)
    assert sum(value["share"] for value in gpu["categories"].values()) == pytest.approx(1)
    # The host's op events stay the host's: the GPU plane adds nothing to them.
    assert op_breakdown(_gpu_trace())["device_time_s"] == pytest.approx(5e-6)


def test_on_a_gpu_the_device_time_is_the_gpus_kernels_and_the_hosts_launches_are_kept_apart():
    """On an H100 a bf16 step's host plane held only _Send/_HostSend events (matmul 0 s): the
    categories must come from the kernels."""
    profile = profile_breakdown(_gpu_trace(), steps=2)
    assert profile["device_time_s"] == pytest.approx(10e-6) == profile["gpu"]["kernel_time_s"]
    assert profile["categories"]["matmul"]["seconds"] == pytest.approx(4e-6)
    assert profile["categories"]["softmax"]["seconds"] == pytest.approx(2e-6)
    assert profile["host"]["device_time_s"] == pytest.approx(5e-6)
    assert profile["host"]["categories"]["matmul"]["seconds"] == pytest.approx(5e-6)
    assert per_target_token(profile, 10)["us_per_tgt_token"]["matmul"] == pytest.approx(0.4)
    cpu = _gpu_trace()
    del cpu.planes[1]
    assert profile_breakdown(cpu, steps=2) == op_breakdown(cpu)  # a CPU profile: the host's ops, nothing else


def test_a_cpu_trace_has_no_gpu_section():
    space = _gpu_trace()
    del space.planes[1]
    assert gpu_breakdown(space, steps=2) is None


def test_xla_programs_inside_a_step_are_counted_once_as_xla():
    """XLA programs called by a non-XLA step leave CpuExecutable/ThunkExecutor events, not `name:type` op events."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    host = space.planes.add(name="/host:CPU")
    names = {1: "transformer_1/encoder_0_1/ffn_1/outer_1/MatMul:_MklMatMul", 2: "CpuExecutable::ExecuteAsyncOnStream",
             3: "ThunkExecutor::Execute", 4: "wrapped_reduce-window.3"}
    for key, name in names.items():
        host.event_metadata[key].name = name
    compute = host.lines.add(name="tf_Compute/1")
    compute.events.add(metadata_id=1, offset_ps=0, duration_ps=3_000_000)
    compute.events.add(metadata_id=2, offset_ps=5_000_000, duration_ps=4_000_000)  # a program: 4 µs
    compute.events.add(metadata_id=3, offset_ps=6_000_000, duration_ps=2_000_000)  # nested in it: not again
    compute.events.add(metadata_id=4, offset_ps=6_500_000, duration_ps=1_000_000)  # an HLO fusion in it
    worker = host.lines.add(name="tf_numa_-1_Eigen/7")
    worker.events.add(metadata_id=3, offset_ps=6_000_000, duration_ps=1_500_000)  # its piece on a worker: 1.5 µs
    breakdown = op_breakdown(space)
    assert breakdown["categories"]["xla"]["seconds"] == pytest.approx(5.5e-6)
    assert breakdown["categories"]["matmul"]["seconds"] == pytest.approx(3e-6)
    assert breakdown["device_time_s"] == pytest.approx(8.5e-6)
