"""transformer.model.layer_norm.LayerNorm: Keras' LayerNormalization's function, gradient and checkpoints."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import build, random_ids

import transformer.model.layers
import transformer.model.transformer
from transformer.model.layer_norm import LayerNorm


def _forward_backward(layer, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
    return [y] + tape.gradient(loss, [x, layer.gamma, layer.beta])


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_layer_norm_matches_keras_forward_and_gradients(policy):
    rng = np.random.default_rng(0)
    x = tf.cast(rng.normal(1.0, 3.0, (4, 7, 32)), keras.mixed_precision.Policy(policy).compute_dtype)
    upstream = tf.constant(rng.normal(size=(4, 7, 32)), tf.float32)
    ours, theirs = LayerNorm(dtype=policy), keras.layers.LayerNormalization(dtype=policy)
    ours.build(x.shape), theirs.build(x.shape)
    for layer in (ours, theirs):  # not the initial 1/0: the gradient formula uses gamma
        layer.gamma.assign(rng.normal(1.0, 0.5, 32)), layer.beta.assign(rng.normal(0.0, 0.5, 32))
        theirs.set_weights(ours.get_weights())
    got, want = _forward_backward(ours, x, upstream), _forward_backward(theirs, x, upstream)
    assert got[0].dtype == want[0].dtype == x.dtype and got[1].dtype == want[1].dtype
    # float32: the same function up to summation order; bfloat16 output: at most one rounding step apart.
    atol = {"float32": 1e-5, "mixed_bfloat16": 3e-2}[policy]
    for a, b in zip(got, want):
        np.testing.assert_allclose(tf.cast(a, tf.float32).numpy(), tf.cast(b, tf.float32).numpy(), atol=atol,
                                   rtol=atol)


def test_layer_norm_keeps_keras_config_and_falls_back_for_other_axes():
    layer = LayerNorm(epsilon=1e-5, name="n")
    assert isinstance(layer, keras.layers.LayerNormalization)
    assert LayerNorm.from_config(layer.get_config()).epsilon == 1e-5
    x = tf.random.normal([3, 4, 5])
    other = LayerNorm(axis=1)
    np.testing.assert_allclose(other(x).numpy(), keras.layers.LayerNormalization(axis=1)(x).numpy(), atol=1e-6)


@pytest.mark.parametrize("layer_norm", ["post", "pre"])
def test_checkpoint_of_keras_layer_norm_model_loads_and_gives_the_same_logits(
        tiny_model_config, tmp_path, monkeypatch, layer_norm):
    config = tiny_model_config(layer_norm=layer_norm)
    src, tgt = random_ids(config)
    with monkeypatch.context() as patch:  # the model as built before LayerNorm existed
        patch.setattr(transformer.model.layers, "LayerNorm", keras.layers.LayerNormalization)
        patch.setattr(transformer.model.transformer, "LayerNorm", keras.layers.LayerNormalization)
        old = build(config, seed=1)
        assert not any(isinstance(layer, LayerNorm) for layer in old._flatten_layers())
        for variable in old.weights:  # trained-looking norms, not the initial 1/0
            if "gamma" in variable.path or "beta" in variable.path:
                variable.assign(tf.random.normal(variable.shape, 0.5, 0.3))
        want = old((src, tgt), training=False).numpy()
        prefix = tf.train.Checkpoint(model=old).save(str(tmp_path / "ckpt"))
    new = build(config, seed=2)
    assert any(isinstance(layer, LayerNorm) for layer in new._flatten_layers())
    tf.train.Checkpoint(model=new).restore(prefix).assert_existing_objects_matched()
    np.testing.assert_allclose(new((src, tgt), training=False).numpy(), want, atol=1e-5, rtol=1e-5)
