"""Masked sequence loss and accuracy: padding (id 0) never counts.

Both expect `y_true [batch, tgt_len]` int ids and `y_pred [batch, tgt_len, vocab]` float32
logits. The loss is the mean over *non-pad target tokens* of the batch (not a mean of
per-sentence means), with optional label smoothing.

Under a tf.distribute strategy with several replicas, "the batch" is the *global* batch:
each replica returns (its sum of token losses) / (non-pad tokens of all replicas), the
count being all-reduced across replicas (`global_sum`). Keras 3 then sums the replicas'
gradients (`TFOptimizer._all_reduce_sum_gradients`), which gives exactly the one-device
gradient of the global batch; a mean of per-replica means would weight a replica's tokens
by 1 / its own token count and scale the gradient by the number of replicas.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from transformer.base.constants import PAD_ID
from transformer.runtime.fused_kernels import active_kernels


@keras.saving.register_keras_serializable(package="transformer")
class MaskedSparseCrossEntropy(keras.losses.Loss):
    """Token-level cross-entropy over non-pad targets, optionally label-smoothed.

    Args:
        label_smoothing: float in [0, 1). Mass spread uniformly over the vocabulary.

    Returns (call): scalar float32, sum of token losses / number of non-pad tokens (of
    all replicas in sync, see the module docstring).
    """

    def __init__(self, label_smoothing: float = 0.0, name: str = "masked_cross_entropy", **kwargs):
        # `call` already reduces to the token mean; "sum" of that scalar leaves it unchanged.
        # A saved config carries `reduction` too: drop it so `from_config` works.
        kwargs.pop("reduction", None)
        super().__init__(name=name, reduction="sum", **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        y_true = tf.cast(y_true, tf.int32)
        mask = token_mask(y_true)
        token_loss = token_cross_entropy(y_true, y_pred, self.label_smoothing)
        return tf.reduce_sum(token_loss * mask) / tf.maximum(global_sum(tf.reduce_sum(mask)), 1.0)

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


def token_cross_entropy(labels: tf.Tensor, logits: tf.Tensor, smoothing: float) -> tf.Tensor:
    """float32 `[...]`, each token's label-smoothed cross-entropy of `logits [..., V]` (any float
    dtype): by the fused CPU kernels' `FusedCrossEntropy` while they are enabled (one pass over
    the logits in their own dtype each way, float32 inside), else `smoothed_cross_entropy` on
    the logits in float32."""
    kernels = active_kernels()
    if kernels is not None and logits.dtype in (tf.float32, tf.bfloat16, tf.float16):
        return fused_cross_entropy(kernels, labels, logits, smoothing)
    return smoothed_cross_entropy(labels, tf.cast(logits, tf.float32), smoothing)


def fused_cross_entropy(kernels, labels: tf.Tensor, logits: tf.Tensor, smoothing: float) -> tf.Tensor:
    """`smoothed_cross_entropy` by the fused kernels (`kernels`: the op library): float32 `[...]`
    from `logits [..., V]` in their own dtype; the gradient, in that dtype, recomputes the softmax
    from the logits and the kept logsumexp (no `[..., V]` float32 tensor is kept or made)."""
    labels = tf.cast(labels, tf.int32)
    maxima = []

    @tf.custom_gradient
    def loss_of(logits):
        loss, log_normalizer, row_max = kernels.fused_cross_entropy(logits, labels, smoothing=float(smoothing))
        maxima.append(row_max)

        def grad(upstream):
            return kernels.fused_cross_entropy_grad(logits, labels, log_normalizer, tf.cast(upstream, tf.float32),
                                                    smoothing=float(smoothing))

        return loss, grad

    loss = loss_of(logits)
    if not tf.executing_eagerly():
        known = getattr(logits.graph, _ROW_MAXIMA, None)
        if known is None:
            known = {}
            setattr(logits.graph, _ROW_MAXIMA, known)
        known[logits.ref()] = maxima[0]
    return loss


# A traced graph's attribute: {logits.ref(): their row maxima from the fused loss's pass} (`logit_row_max`).
_ROW_MAXIMA = "_transformer_logit_row_maxima"


def logit_row_max(logits: tf.Tensor) -> tf.Tensor:
    """float32 `[...]`, the maximum of `logits [..., V]` over the last axis: the fused loss's own,
    where it already read these logits in this graph (the training step's loss, then its
    accuracy), else a `reduce_max` pass (on `[8192, 7,000]` float32 logits ~20 ms of a step)."""
    logits = tf.convert_to_tensor(logits)
    row_max = None if tf.executing_eagerly() else getattr(logits.graph, _ROW_MAXIMA, {}).get(logits.ref())
    return row_max if row_max is not None else tf.cast(tf.reduce_max(logits, axis=-1), tf.float32)


def smoothed_cross_entropy(labels: tf.Tensor, logits: tf.Tensor, smoothing: float) -> tf.Tensor:
    """Label-smoothed cross-entropy per token from one fused softmax, without a dense target tensor.

    With targets q = (1 - s)·one_hot(label) + s/V, −Σ q·log softmax(z) is
    logsumexp(z) − (1 − s)·z[label] − (s/V)·Σ z, and its gradient is softmax(z) − q. The
    forward pass runs the softmax once (one fused kernel, oneDNN's on CPU) and keeps it for the
    backward pass, which is then (p − s/V)·upstream with (1 − s)·upstream taken off at each
    label (a scatter of one value per token): no second exp, no one-hot `[..., V]`. The
    logsumexp comes out of the same softmax: the largest probability belongs to the largest
    logit, so logsumexp(z) = max z − log max p, and max p ≥ 1/V never underflows. On
    `[2048, 4527]` float32 logits, loss and gradient with the accuracy's maximum 39 → 27 ms
    (the exp-twice closed form before; TensorFlow's `sparse_softmax_cross_entropy_with_logits`
    kernel alone takes 33 ms; 2-core EPYC Zen 4 avx512_bf16, 2026-12-03, docs/speed.md).
    `tests/model/test_losses.py` checks value and gradient against the dense formulation.

    Args:
        labels: int32 `[...]`, class ids in [0, V).
        logits: float32 `[..., V]`.
        smoothing: float s in [0, 1); 0 is plain cross-entropy.

    Returns:
        float32 `[...]`, the loss of each token.
    """
    rank = labels.shape.rank

    @tf.custom_gradient
    def loss_of(logits):
        vocab = tf.cast(tf.shape(logits)[-1], logits.dtype)
        probabilities = tf.nn.softmax(logits)  # [..., V], kept for the gradient
        log_normalizer = tf.reduce_max(logits, axis=-1) - tf.math.log(tf.reduce_max(probabilities, axis=-1))
        loss = log_normalizer - (1.0 - smoothing) * tf.gather(logits, labels, batch_dims=rank)
        if smoothing:
            loss -= (smoothing / vocab) * tf.reduce_sum(logits, axis=-1)

        def grad(upstream):  # upstream [...] → d loss / d logits [..., V]
            scale = upstream[..., tf.newaxis]
            gradient = (probabilities - smoothing / vocab) * scale if smoothing else probabilities * scale
            flat = tf.reshape(gradient, [-1, tf.shape(logits)[-1]])  # [tokens, V]
            at_label = tf.stack([tf.range(tf.size(labels)), tf.reshape(labels, [-1])], axis=1)
            flat = tf.tensor_scatter_nd_sub(flat, at_label, (1.0 - smoothing) * tf.reshape(upstream, [-1]))
            return tf.reshape(flat, tf.shape(logits))

        return loss, grad

    return loss_of(logits)


def token_mask(y_true: tf.Tensor) -> tf.Tensor:
    """float32, `y_true`'s shape: 1 at real target tokens, 0 at [PAD]; what the loss averages over."""
    return tf.cast(tf.not_equal(tf.cast(y_true, tf.int32), PAD_ID), tf.float32)


def global_sum(value: tf.Tensor) -> tf.Tensor:
    """`value` summed over the replicas in sync; `value` itself with one replica or outside `strategy.run`."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


@keras.saving.register_keras_serializable(package="transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of non-pad target tokens whose label has the largest logit, over all batches seen."""

    def __init__(self, name: str = "masked_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct", dtype="float32")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = tf.cast(y_true, tf.int32)
        # A hit when the label's logit is the largest: the loss's own maximum of the same logits
        # (the fused kernel's third output, or the same reduce_max in one graph, which grappler
        # computes once), instead of an ArgMax pass (4.7 vs 1.9 ms on [2048, 4527],
        # docs/speed.md). A tie at the maximum counts as a hit.
        chosen = tf.cast(tf.gather(y_pred, y_true, batch_dims=y_true.shape.rank), tf.float32)
        mask = tf.not_equal(y_true, PAD_ID)
        hits = tf.logical_and(chosen >= logit_row_max(y_pred), mask)
        self.correct.assign_add(tf.reduce_sum(tf.cast(hits, tf.float32)))
        self.total.assign_add(tf.reduce_sum(tf.cast(mask, tf.float32)))

    def result(self):
        return self.correct / tf.maximum(self.total, 1.0)
