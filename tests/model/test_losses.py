"""Masked loss / accuracy (padding never counts) and the warmup learning-rate schedule."""

import keras
import numpy as np
import pytest

from transformer.base.constants import PAD_ID
from transformer.model.losses import MaskedAccuracy, MaskedSparseCrossEntropy
from transformer.model.schedule import WarmupInverseSqrt

VOCAB = 11


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@pytest.fixture
def batch():
    """y_true [3, 5] with 0, 1 and 3 trailing pads; y_pred [3, 5, VOCAB] float32 logits."""
    rng = np.random.default_rng(0)
    y_true = rng.integers(1, VOCAB, (3, 5)).astype("int32")
    y_true[1, -1:] = PAD_ID
    y_true[2, -3:] = PAD_ID
    y_pred = rng.normal(0, 2, (3, 5, VOCAB)).astype("float32")
    return y_true, y_pred


def hand_loss(y_true, y_pred, smoothing=0.0) -> float:
    """Mean over non-pad tokens of -Σ q·log p, q = (1-s)·one_hot + s/V."""
    log_p = log_softmax(y_pred.astype("float64"))
    q = (1 - smoothing) * np.eye(VOCAB)[y_true] + smoothing / VOCAB
    token_loss = -(q * log_p).sum(-1)
    real = y_true != PAD_ID
    return float(token_loss[real].sum() / real.sum())


def test_loss_is_the_mean_over_non_pad_tokens(batch):
    y_true, y_pred = batch
    loss = float(MaskedSparseCrossEntropy()(y_true, y_pred))
    assert loss == pytest.approx(hand_loss(y_true, y_pred), rel=1e-5)

    # A token mean, not a mean of per-sentence means (those differ on this batch).
    log_p = log_softmax(y_pred.astype("float64"))
    token_loss = -np.take_along_axis(log_p, y_true[..., None], -1)[..., 0]
    real = y_true != PAD_ID
    sentence_means = [token_loss[i][real[i]].mean() for i in range(len(y_true))]
    assert abs(np.mean(sentence_means) - loss) > 1e-3


def test_loss_ignores_logits_at_pad_positions(batch):
    y_true, y_pred = batch
    loss = MaskedSparseCrossEntropy()
    changed = y_pred.copy()
    changed[y_true == PAD_ID] = np.random.default_rng(1).normal(0, 50, (int((y_true == PAD_ID).sum()), VOCAB))
    assert float(loss(y_true, changed)) == pytest.approx(float(loss(y_true, y_pred)), rel=1e-6)
    # ...while the same change at a real position does move it.
    real_changed = y_pred.copy()
    real_changed[0, 0] = changed[2, -1]
    assert abs(float(loss(y_true, real_changed)) - float(loss(y_true, y_pred))) > 1e-3


def test_all_pad_batch_gives_zero_not_nan():
    y_true = np.zeros((2, 4), "int32")
    y_pred = np.random.default_rng(0).normal(size=(2, 4, VOCAB)).astype("float32")
    assert float(MaskedSparseCrossEntropy()(y_true, y_pred)) == 0.0


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_label_smoothing(batch, smoothing):
    y_true, y_pred = batch
    smoothed = float(MaskedSparseCrossEntropy(label_smoothing=smoothing)(y_true, y_pred))
    plain = float(MaskedSparseCrossEntropy()(y_true, y_pred))
    assert smoothed == pytest.approx(hand_loss(y_true, y_pred, smoothing), rel=1e-5)
    assert abs(smoothed - plain) > 1e-3

    # Keras' own label-smoothed categorical cross-entropy agrees on the non-pad tokens.
    real = y_true != PAD_ID
    reference = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)
    expected = float(reference(np.eye(VOCAB, dtype="float32")[y_true[real]], y_pred[real]))
    assert smoothed == pytest.approx(expected, rel=1e-5)

    # With confident, correct logits smoothing costs more than plain cross-entropy.
    confident = (np.eye(VOCAB)[y_true] * 20).astype("float32")
    assert float(MaskedSparseCrossEntropy(label_smoothing=smoothing)(y_true, confident)) > \
        float(MaskedSparseCrossEntropy()(y_true, confident)) + 0.1


def test_loss_config_round_trip():
    loss = MaskedSparseCrossEntropy(label_smoothing=0.2)
    clone = MaskedSparseCrossEntropy.from_config(loss.get_config())
    assert clone.label_smoothing == 0.2
    assert clone.get_config() == loss.get_config()


def test_masked_accuracy_counts_only_real_tokens_across_batches():
    def logits_for(predicted):
        return (np.eye(VOCAB)[np.array(predicted)] * 5).astype("float32")

    metric = MaskedAccuracy()
    # Batch 1: 5 real tokens, 3 right; the 2 pad positions predict pad (id 0) — must not count.
    y1 = np.array([[4, 5, 6, 0], [7, 8, 0, 0]], "int32")
    p1 = [[4, 5, 9, 0], [7, 2, 0, 0]]
    metric.update_state(y1, logits_for(p1))
    assert float(metric.result()) == pytest.approx(3 / 5)
    # Batch 2: 3 real tokens, 1 right; the pad position predicts a real token — still ignored.
    y2 = np.array([[1, 2, 3, 0]], "int32")
    p2 = [[1, 3, 2, 9]]
    metric.update_state(y2, logits_for(p2))
    assert float(metric.result()) == pytest.approx((3 + 1) / (5 + 3))
    metric.reset_state()
    assert float(metric.result()) == 0.0


def expected_lr(d_model, warmup, iteration):
    step = iteration + 1  # the schedule counts steps from 1: the first update is not at lr 0
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("d_model,warmup", [(128, 4000), (16, 10)])
def test_warmup_schedule_matches_the_paper(d_model, warmup):
    schedule = WarmupInverseSqrt(d_model, warmup)
    iterations = [0, 1, 2, warmup // 2, warmup - 2, warmup - 1, warmup, 2 * warmup, 10 * warmup]
    for iteration in iterations:
        assert float(schedule(iteration)) == pytest.approx(expected_lr(d_model, warmup, iteration), rel=1e-5)
    assert float(schedule(0)) > 0
    lrs = schedule(np.arange(3 * warmup)).numpy()
    assert int(np.argmax(lrs)) == warmup - 1  # peak at step == warmup
    assert max(lrs) == pytest.approx((d_model * warmup) ** -0.5, rel=1e-5)


def test_optimizer_uses_the_schedule_at_its_iteration_count():
    schedule = WarmupInverseSqrt(32, 50)
    optimizer = keras.optimizers.Adam(schedule)
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    for iteration in (0, 7, 49, 300):
        optimizer.iterations.assign(iteration)
        assert float(optimizer.learning_rate) == pytest.approx(expected_lr(32, 50, iteration), rel=1e-5)
    clone = WarmupInverseSqrt.from_config(schedule.get_config())
    assert float(clone(123)) == pytest.approx(float(schedule(123)))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.4])
def test_smoothed_loss_value_and_gradient_equal_the_dense_formulation(smoothing):
    """The closed-form loss/gradient equals softmax_cross_entropy_with_logits on dense smoothed targets."""
    import tensorflow as tf

    from transformer.model.losses import smoothed_cross_entropy

    rng = np.random.default_rng(3)
    labels = tf.constant(rng.integers(0, VOCAB, (4, 6)), tf.int32)
    logits = tf.constant(rng.normal(0, 3, (4, 6, VOCAB)), tf.float32)
    upstream = tf.constant(rng.normal(size=(4, 6)), tf.float32)  # a non-uniform weight per token

    def dense(z):
        q = tf.one_hot(labels, VOCAB, on_value=1 - smoothing + smoothing / VOCAB, off_value=smoothing / VOCAB)
        return tf.nn.softmax_cross_entropy_with_logits(q, z)

    results = []
    for fn in (dense, lambda z: smoothed_cross_entropy(labels, z, smoothing)):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            token_loss = fn(logits)
            weighted = tf.reduce_sum(token_loss * upstream)
        results.append((token_loss.numpy(), tape.gradient(weighted, logits).numpy()))
    (loss_dense, grad_dense), (loss_closed, grad_closed) = results
    np.testing.assert_allclose(loss_closed, loss_dense, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_closed, grad_dense, rtol=1e-4, atol=1e-6)
    assert np.abs(grad_dense).max() > 0.1  # a gradient worth comparing


def test_loss_stays_finite_where_the_labels_probability_underflows():
    """logsumexp comes from the largest probability, not the label's: a label 200 nats below
    the best logit (its probability 0 in float32) still gives the exact loss and gradient."""
    import tensorflow as tf

    from transformer.model.losses import smoothed_cross_entropy

    logits = np.zeros((2, VOCAB), "float32")
    logits[0, 3] = 200.0  # label 1's probability exp(-200) underflows
    logits[1, 5] = -200.0
    labels = tf.constant([1, 5], tf.int32)
    z = tf.constant(logits)
    for smoothing in (0.0, 0.1):
        with tf.GradientTape() as tape:
            tape.watch(z)
            token_loss = smoothed_cross_entropy(labels, z, smoothing)
            total = tf.reduce_sum(token_loss)
        gradient = tape.gradient(total, z).numpy()
        expected = [-(q * log_softmax(row.astype("float64"))).sum()
                    for row, q in zip(logits, (1 - smoothing) * np.eye(VOCAB)[[1, 5]] + smoothing / VOCAB)]
        np.testing.assert_allclose(token_loss.numpy(), expected, rtol=1e-5)
        assert np.isfinite(gradient).all()
        assert gradient[0, 1] == pytest.approx(-(1 - smoothing) - smoothing / VOCAB, abs=1e-6)
        assert gradient[0, 3] == pytest.approx(1 - smoothing / VOCAB, abs=1e-6)


def test_masked_accuracy_equals_argmax_accuracy_on_random_logits():
    """The max-based hit test gives argmax's accuracy when no two logits tie."""
    rng = np.random.default_rng(4)
    y_true = rng.integers(0, VOCAB, (6, 9)).astype("int32")
    y_pred = rng.normal(0, 1, (6, 9, VOCAB)).astype("float32")
    y_pred[..., 2] += 1.0  # some hits and some misses
    metric = MaskedAccuracy()
    metric.update_state(y_true, y_pred)
    real = y_true != PAD_ID
    expected = (y_pred.argmax(-1) == y_true)[real].mean()
    assert 0.0 < expected < 1.0
    assert float(metric.result()) == pytest.approx(expected)
