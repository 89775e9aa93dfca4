"""A `DropoutSwitch` turns every dropout of a model off and on inside one traced step
(late dropout), without changing the model's weights, checkpoint layout or inference."""

import numpy as np
import tensorflow as tf
from helpers_model import build, random_ids

from transformer.model.dropout import DropoutSwitch, FastDropout, attach_dropout_switch
from transformer.model.layers import CachedMultiHeadAttention


def test_every_dropout_site_follows_the_switch(tiny_model_config):
    model = build(tiny_model_config(dropout_rate=0.3))
    switch = DropoutSwitch(on=False)
    sites = attach_dropout_switch(model, switch)
    layers = list(model._flatten_layers(include_self=False, recursive=True))
    attentions = [layer for layer in layers if isinstance(layer, CachedMultiHeadAttention)]
    fast = [layer for layer in layers if isinstance(layer, FastDropout)]
    assert len(attentions) == 6 and fast  # 2 encoder self, 2 decoder self + 2 cross
    assert sites == len(attentions) + len(fast)
    assert all(layer._dropout_layer.dropout_switch is switch for layer in attentions)
    assert all(layer.dropout_switch is switch for layer in fast)


def test_off_is_the_model_without_dropout_and_on_is_dropout_in_the_same_trace(tiny_model_config):
    tf.config.experimental.enable_tensor_float_32_execution(False)
    config = tiny_model_config(dropout_rate=0.3)
    model = build(config)
    src, tgt = random_ids(config)
    inference = model((src, tgt), training=False).numpy()
    switch = DropoutSwitch(on=False)
    attach_dropout_switch(model, switch)
    step = tf.function(lambda: model((src, tgt), training=True))
    # Off: no dropout anywhere. Not bit-equal: inference computes the attention projections as
    # 2-D matmuls, training through Keras' EinsumDense (other rounding, ~1e-6; dropout: > 1e-3).
    np.testing.assert_allclose(step().numpy(), inference, atol=1e-5, rtol=0)
    switch.set(True)
    dropped = step().numpy()
    assert step.experimental_get_tracing_count() == 1  # switching retraced nothing
    assert np.abs(dropped - inference).max() > 1e-3  # on: the model's dropout
    switch.set(False)
    np.testing.assert_allclose(step().numpy(), inference, atol=1e-5, rtol=0)


def test_a_switch_changes_neither_weights_nor_checkpoint_layout(tiny_model_config, tmp_path):
    config = tiny_model_config(dropout_rate=0.3)
    plain, switched = build(config), build(config)
    attach_dropout_switch(switched, DropoutSwitch(on=True))

    def paths(model):  # without the model's own (numbered) name
        return [w.path.split("/", 1)[1] for w in model.weights]

    assert paths(switched) == paths(plain)
    written = {name: tf.train.Checkpoint(model=model).write(str(tmp_path / name / "ckpt"))
               for name, model in (("plain", plain), ("switched", switched))}
    keys = {name: sorted(k for k, _ in tf.train.list_variables(path)) for name, path in written.items()}
    assert keys["switched"] == keys["plain"]
    assert not any("dropout_on" in key for key in keys["switched"])
