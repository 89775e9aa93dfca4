"""The training step's element-wise blocks as small XLA programs, matrix products left outside.

XLA on CPU compiles the whole train step's bfloat16 dots to float32 (TensorFlow 2.21: no
oneDNN/AMX inside XLA, `ONEDNN_VERBOSE=1` shows only `gemm_api` f32 calls), so a fully
compiled step loses the AMX. Without XLA, every element-wise op of the step is one kernel
and one pass over memory. Here the two element-wise chains around the matrix products are
each one `tf.function(jit_compile=True)` forward and one backward (an `XlaLaunch` inside the
ordinary graph), with the gradient in closed form (`tf.custom_gradient`):

    softmax_dropout:  logits [B, heads, T, S] (compute dtype) + mask bias (float32)
                      → p = softmax in float32 → dropout(p) in the compute dtype, and p
    residual_norm:    LN(x + dropout(update)) over the last axis, statistics in float32

Dropout draws its random bits as `fast_dropout` does (16 per element, seeded from the layer's
Keras `SeedGenerator`), with TensorFlow's kernel outside the programs (XLA's CPU generator is
far slower, `_random_words`); forward and backward programs read the same bits. The functions
compute what the unfused layers compute (softmax + `fast_dropout`, `layer_norm`); only
training calls them (`training=True` with the layer's fusion switched on,
`Transformer.use_fused_blocks`), so inference, export and checkpoints are unchanged.
"""

from __future__ import annotations

import tensorflow as tf

_HALF_RANGE = 65536


def _random_words(x, seed, rate: float):
    """The random bits of a dropout mask over `x`: uint32 `[⌈size / 2⌉]`, or None for rate 0.

    Drawn by TensorFlow's kernel, outside XLA: XLA's CPU random-number generator ran 130×
    slower (284 vs 2.1 ms for 524k words; 2-core Intel Xeon with amx_bf16, TF 2.21).
    """
    if rate <= 0.0:
        return None
    return tf.random.stateless_uniform([(tf.size(x) + 1) // 2], seed, minval=None, maxval=None, dtype=tf.uint32)


def _dropped(x, words, rate: float):
    """`x` with elements dropped where their 16 bits of `words` are < rate · 2¹⁶, the rest scaled.

    As `transformer.model.dropout.fast_dropout`: the rate to within 2⁻¹⁷, kept values × 1 / (1 − rate).
    """
    if words is None:
        return x
    halves = tf.reshape(tf.bitcast(words, tf.uint16), [-1])[:tf.size(x)]
    threshold = tf.constant(min(round(rate * _HALF_RANGE), _HALF_RANGE - 1), tf.uint16)
    keep = tf.reshape(halves >= threshold, tf.shape(x))
    return tf.where(keep, x * (1.0 / (1.0 - rate)), tf.zeros_like(x))


@tf.function(jit_compile=True, autograph=False)
def _softmax_dropout_forward(logits, bias, words, rate):
    probs = tf.nn.softmax(tf.cast(logits, tf.float32) + bias, axis=-1)
    return tf.cast(_dropped(probs, words, rate), logits.dtype), probs


@tf.function(jit_compile=True, autograph=False)
def _softmax_dropout_backward(d_out, d_probs, probs, words, rate):
    g = _dropped(tf.cast(d_out, tf.float32), words, rate)
    if d_probs is not None:
        g += d_probs
    return tf.cast(probs * (g - tf.reduce_sum(g * probs, -1, keepdims=True)), d_out.dtype)


def softmax_dropout(logits, bias, seed, rate: float):
    """Masked softmax over the last axis, then dropout: one XLA program each way.

    Args:
        logits: `[batch, heads, query_len, key_len]` in the compute dtype.
        bias: float32, broadcastable to `logits` (0 where attended, a large negative where
            masked; no gradient).
        seed: int32 `[2]`, the dropout's stateless seed.
        rate: float. Dropout rate (0: none).

    Returns:
        (dropped probabilities in `logits.dtype`, probabilities float32), both `logits`' shape.
    """
    words = _random_words(logits, seed, rate)

    @tf.custom_gradient
    def _fused(logits, bias):
        dropped, probs = _softmax_dropout_forward(logits, bias, words, rate)

        def grad(d_out, d_probs=None):
            return _softmax_dropout_backward(d_out, d_probs, probs, words, rate), None

        return (dropped, probs), grad

    return _fused(logits, bias)


@tf.function(jit_compile=True, autograph=False)
def _residual_norm_forward(x, update, gamma, beta, words, rate, epsilon):
    total = tf.cast(x, tf.float32) + _dropped(tf.cast(update, tf.float32), words, rate)
    centred = total - tf.reduce_mean(total, -1, keepdims=True)
    inv = tf.math.rsqrt(tf.reduce_mean(tf.square(centred), -1, keepdims=True) + epsilon)
    normed = centred * inv
    return tf.cast(normed * gamma + beta, x.dtype), normed, inv


@tf.function(jit_compile=True, autograph=False)
def _residual_norm_backward(dy, normed, inv, gamma, words, rate, x_dtype, update_dtype):
    dy32 = tf.cast(dy, tf.float32)
    g = dy32 * gamma
    d_total = inv * (g - tf.reduce_mean(g, -1, keepdims=True) - normed * tf.reduce_mean(g * normed, -1, keepdims=True))
    rows = list(range(len(dy.shape) - 1))
    return (tf.cast(d_total, x_dtype), tf.cast(_dropped(d_total, words, rate), update_dtype),
            tf.reduce_sum(dy32 * normed, rows), tf.reduce_sum(dy32, rows))


def residual_norm(x, update, gamma, beta, seed, rate: float, epsilon: float):
    """`LN(x + dropout(update))` over the last axis (post-norm residual): one XLA program each way.

    Args:
        x, update: `[..., d]` in the compute dtype (the residual stream and the sublayer output).
        gamma, beta: float32 `[d]`.
        seed: int32 `[2]`; rate: float (0: no dropout); epsilon: the norm's epsilon.

    Returns:
        `[..., d]` in `x.dtype`; statistics and affine in float32, as `layer_norm`.
    """
    words = _random_words(update, seed, rate)

    @tf.custom_gradient
    def _fused(x, update, gamma, beta):
        y, normed, inv = _residual_norm_forward(x, update, gamma, beta, words, rate, epsilon)

        def grad(dy):
            return _residual_norm_backward(dy, normed, inv, gamma, words, rate, x.dtype, update.dtype)

        return y, grad

    return _fused(x, update, gamma, beta)
