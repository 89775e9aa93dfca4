"""FLOP counts for one encoder-decoder Transformer training step, and a peak-FLOP/s probe.

Units: FLOPs (one multiply-add = 2 FLOPs), FLOP/s, seconds.

Only matrix multiplications are counted (projections, attention scores, attention-weighted
sums, feed-forward, vocabulary projection); embedding lookups, softmax, layer norm, dropout
and the loss are a few percent at most and are left out. Lengths are the *padded* lengths:
that is what the hardware computes, pad or not. A training step is counted as 3 × forward
(the backward pass costs about twice the forward one). The attention value width is taken
equal to `key_dim` (Keras `MultiHeadAttention`'s default). A causal mask does not shrink a
dense attention matmul, so decoder self-attention is counted in full.

`measure_peak_flops` times a chain of square matmuls on one device, compile excluded, and
returns the achieved FLOP/s: a practical "peak" to divide model FLOP/s by (utilisation).
The probe must saturate the device it measures: on a GPU 8192² matmuls in the run's compute
dtype (on an H100, 2048² matmuls measured 82.6 TFLOP/s where 8192² bf16 ones ran at 758);
on a CPU 1024², which keep every core busy in a few milliseconds (`peak_probe_shape`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import tensorflow as tf


def _attention_flops(q_len: int, kv_len: int, d_model: int, num_heads: int, key_dim: int) -> float:
    """Forward FLOPs of one multi-head attention block for one sequence."""
    width = num_heads * key_dim
    query = 2 * q_len * d_model * width
    key_value = 2 * (2 * kv_len * d_model * width)
    scores = 2 * num_heads * q_len * kv_len * key_dim  # Q·Kᵀ
    weighted = 2 * num_heads * q_len * kv_len * key_dim  # softmax(...)·V
    output = 2 * q_len * width * d_model
    return float(query + key_value + scores + weighted + output)


def _ffn_flops(seq_len: int, d_model: int, dff: int) -> float:
    """Forward FLOPs of the two feed-forward matmuls (d_model → dff → d_model)."""
    return float(2 * (2 * seq_len * d_model * dff))


def transformer_forward_flops(
    *,
    num_layers: int,
    d_model: int,
    dff: int,
    num_heads: int,
    key_dim: int,
    tgt_vocab_size: int,
    src_len: int,
    tgt_len: int,
) -> float:
    """Forward matmul FLOPs for ONE (source, target) pair of padded lengths."""
    encoder_layer = _attention_flops(src_len, src_len, d_model, num_heads, key_dim) + _ffn_flops(
        src_len, d_model, dff
    )
    decoder_layer = (
        _attention_flops(tgt_len, tgt_len, d_model, num_heads, key_dim)  # causal self-attention
        + _attention_flops(tgt_len, src_len, d_model, num_heads, key_dim)  # cross-attention
        + _ffn_flops(tgt_len, d_model, dff)
    )
    vocab_projection = 2.0 * tgt_len * d_model * tgt_vocab_size
    return num_layers * (encoder_layer + decoder_layer) + vocab_projection


def transformer_train_flops(
    *,
    num_layers: int,
    d_model: int,
    dff: int,
    num_heads: int,
    key_dim: int,
    tgt_vocab_size: int,
    batch_size: int,
    src_len: int,
    tgt_len: int,
) -> float:
    """FLOPs of one training step (forward + backward ≈ 3 × forward) on a padded batch."""
    forward = transformer_forward_flops(
        num_layers=num_layers,
        d_model=d_model,
        dff=dff,
        num_heads=num_heads,
        key_dim=key_dim,
        tgt_vocab_size=tgt_vocab_size,
        src_len=src_len,
        tgt_len=tgt_len,
    )
    return 3.0 * batch_size * forward


@dataclass(frozen=True)
class TransformerDims:
    """The architecture numbers the FLOP count needs.

    Args:
        num_layers: int. Encoder layers (= decoder layers).
        d_model: int. Model width.
        dff: int. Feed-forward inner width.
        num_heads: int. Attention heads.
        key_dim: int. Per-head query/key/value width (`d_model` for the tutorial's heads,
            `d_model // num_heads` for the paper's).
        tgt_vocab_size: int. Output vocabulary size.
    """

    num_layers: int
    d_model: int
    dff: int
    num_heads: int
    key_dim: int
    tgt_vocab_size: int

    @classmethod
    def from_config(cls, model_config: Any) -> "TransformerDims":
        """Reads the same-named attributes from a model config (e.g. `ModelConfig`)."""
        return cls(**{name: int(getattr(model_config, name)) for name in cls.__dataclass_fields__})

    def train_flops(self, batch_size: int, src_len: int, tgt_len: int) -> float:
        """FLOPs of one training step on a `[batch_size, src_len]`/`[batch_size, tgt_len]` batch."""
        return transformer_train_flops(
            **vars(self), batch_size=batch_size, src_len=src_len, tgt_len=tgt_len
        )


GPU_PROBE_SIZE = 8192  # matrix side on a GPU: 2·8192³ = 1.1 TFLOP per matmul, ~1.5 ms on an H100 in bf16
CPU_PROBE_SIZE = 1024  # matrix side on a CPU: 2.1 GFLOP per matmul, a few ms on a few cores


def default_device() -> str:
    """'/GPU:0' when a GPU is visible (not hidden by --device cpu), else '/CPU:0'."""
    return "/GPU:0" if tf.config.get_visible_devices("GPU") else "/CPU:0"


def _compute_dtype(dtype: str) -> tf.DType:
    """Maps a dtype or Keras policy name ('mixed_float16' → float16) to a TF dtype."""
    return tf.as_dtype(dtype.removeprefix("mixed_"))


def peak_probe_shape(device: str, dtype: str = "float32") -> tuple[int, str]:
    """(matrix side, matmul dtype) that saturate `device` in the compute dtype of `dtype`.

    Args:
        device: str. TF device string ("/GPU:0", "/job:localhost/replica:0/task:0/device:CPU:0").
        dtype: str. A dtype or Keras policy name: "mixed_bfloat16" → "bfloat16".

    Returns:
        (GPU_PROBE_SIZE on a GPU else CPU_PROBE_SIZE, the dtype name).
    """
    size = GPU_PROBE_SIZE if "GPU" in device.upper() else CPU_PROBE_SIZE
    return size, _compute_dtype(dtype).name


def matmul_chain_timer(dtype: str = "float32", device: str | None = None,
                       size: int | None = None) -> Callable[[int], float]:
    """A warmed-up timer of chains of square `size`² matmuls in `dtype` on `device`.

    Returns `timed(iters)`: the seconds one chain of `iters` matmuls takes (each matmul is
    2·size³ FLOPs). Tracing, compilation and allocator warm-up happen here, not in `timed`.
    """
    device = device or default_device()
    size = size or peak_probe_shape(device, dtype)[0]
    tf_dtype = _compute_dtype(dtype)

    with tf.device(device):
        # Scaled so a chain of products keeps roughly unit magnitude (no inf/denormals).
        a = tf.cast(tf.random.normal([size, size], seed=1), tf_dtype)
        b = tf.cast(tf.random.normal([size, size], seed=2) / size**0.5, tf_dtype)

    @tf.function
    def chain(x: tf.Tensor, iters: tf.Tensor) -> tf.Tensor:
        for _ in tf.range(iters):
            x = tf.matmul(x, b)
        return x[0, 0]  # a scalar to fetch: fetching it waits for the whole chain

    def timed(iters: int) -> float:
        with tf.device(device):
            start = time.perf_counter()
            float(chain(a, tf.constant(iters)))
            return time.perf_counter() - start

    timed(1)  # trace + compile + allocator warm-up
    return timed


def measure_peak_flops(
    dtype: str = "float32",
    device: str | None = None,
    seconds: float = 1.0,
    size: int | None = None,
) -> float:
    """Achieved FLOP/s of square matmuls on `device` (warm-up and compile excluded).

    Args:
        dtype: str. Matmul dtype, or a Keras policy name such as "mixed_float16".
            Defaults to "float32".
        device: str or None. TF device string; None picks '/GPU:0' if visible, else '/CPU:0'.
        seconds: float. Approximate length of the timed run. Defaults to 1.0.
        size: int or None. Matrix side; None: `peak_probe_shape` (8192 on GPU, 1024 on CPU).

    Returns:
        float FLOP/s.
    """
    device = device or default_device()
    size = size or peak_probe_shape(device, dtype)[0]
    timed = matmul_chain_timer(dtype, device, size)
    per_matmul = timed(4) / 4
    iters = max(1, int(seconds / max(per_matmul, 1e-9)))
    elapsed = timed(iters)
    return 2.0 * size**3 * iters / elapsed
