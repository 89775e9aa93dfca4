"""Gradient accumulation (`--accumulate-steps N`): one optimizer update from N micro-batches.

The input pipeline builds each training batch N times larger (N × `max_tokens`, or N ×
`batch_size` sentences); `accumulated_train_step` splits its rows into N micro-batches,
runs forward and backward on one at a time (each waits for the previous one's gradients, so
only one micro-batch's activations are alive), sums their gradients and applies them once.
So `fit` steps, `optimizer.iterations`, the learning-rate schedule and the step-time report
all count optimizer updates; a step's tokens are those of its N micro-batches.

The update equals that of the whole batch in one pass (float32 round-off apart): every
micro-batch's loss is weighted by its share of the batch's non-pad target tokens, so the sum
is the batch's token mean (`MaskedSparseCrossEntropy`), not a mean of micro-batch means,
which would over-weight a micro-batch of short sentences. Sparse (IndexedSlices) embedding
gradients are concatenated, not densified: `FusedAdam` updates them as it does a whole
batch's. Under float16 loss scaling every micro-batch's loss is scaled by the same factor and
the optimizer (LossScaleOptimizer) unscales and checks the sum once. Dropout draws a new mask
per micro-batch, as it would per row of the whole batch.

Why not Keras' own `gradient_accumulation_steps` (Keras 3 optimizers): it applies once per N
*optimizer calls*, i.e. N `fit` steps, so the schedule, the step count, checkpoints and every
per-step callback would count micro-batches; it averages micro-batch means (unequal token
weights) and densifies the embeddings' sparse gradients into accumulator variables.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from transformer.base.constants import PAD_ID
from transformer.model.losses import global_sum, token_mask


def accumulated_train_step(model: keras.Model, data, steps: int) -> dict:
    """Keras `train_step` for `model` over `data` = `((src [rows, src_len], tgt_in [rows, len]), tgt_out [rows, len])`,
    split into `steps` micro-batches of ceil(rows / steps) rows (all-pad rows fill the last ones,
    which the masked loss ignores). Returns the metrics' results, as Keras' step does."""
    (src, tgt_in), tgt_out, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if sample_weight is not None:
        raise ValueError("gradient accumulation does not take sample weights (the loss masks padding)")
    rows = tf.shape(tgt_out)[0]
    micro = (rows + steps - 1) // steps
    fill = micro * steps - rows
    src, tgt_in, tgt_out = (tf.pad(t, [[0, fill], [0, 0]], constant_values=PAD_ID) for t in (src, tgt_in, tgt_out))
    batch_tokens = global_sum(_tokens(tgt_out))  # the normaliser of the whole update (all replicas)
    variables = model.trainable_weights
    gradients, total_loss = None, tf.constant(0.0)
    for i in range(steps):
        after = [] if gradients is None else [_dense_part(g) for g in gradients if g is not None]
        with tf.control_dependencies(after):  # one micro-batch at a time: its activations freed before the next
            part = slice(i * micro, (i + 1) * micro)
            x, y = (tf.identity(src[part]), tf.identity(tgt_in[part])), tf.identity(tgt_out[part])
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)  # this micro-batch's token mean
            loss = loss * (global_sum(_tokens(y)) / tf.maximum(batch_tokens, 1.0))  # → its share of the batch's
            scaled = model.optimizer.scale_loss(loss)
        step_gradients = tape.gradient(scaled, variables)
        gradients = step_gradients if gradients is None else [_add(a, b) for a, b in zip(gradients, step_gradients)]
        total_loss += tf.cast(loss, tf.float32)
        model.compute_metrics(x, y, y_pred)
    replicas = tf.distribute.get_strategy().num_replicas_in_sync  # as Keras: unscaled for distribution
    model._loss_tracker.update_state(total_loss * replicas, sample_weight=rows)
    model.optimizer.apply_gradients(zip(gradients, variables))
    return model.get_metrics_result()


def _tokens(tgt_out: tf.Tensor) -> tf.Tensor:
    """Real target tokens of `tgt_out` as the loss counts them (`token_mask`), float32 scalar."""
    return tf.reduce_sum(token_mask(tgt_out))


def _dense_part(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient


def _add(a, b):
    """The sum of two gradients of one variable; IndexedSlices + IndexedSlices stay sparse (concatenated rows)."""
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0),
                                a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
