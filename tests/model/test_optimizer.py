"""FusedAdam: the same update and state as Keras' Adam, in one fused kernel per variable."""

import keras
import numpy as np
import tensorflow as tf

from transformer.model.optimizer import FusedAdam


def _train(optimizer_cls, steps=5, checkpoint_from=None, first_step=0):
    """A dense matrix and an embedding (IndexedSlices gradient, a repeated id) trained a few steps."""
    tf.random.set_seed(0)
    dense = keras.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), name="dense")
    table = keras.Variable(np.linspace(0, 2, 20, dtype=np.float32).reshape(5, 4), name="table")
    optimizer = optimizer_cls(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    optimizer.build([dense, table])
    if checkpoint_from is not None:
        tf.train.Checkpoint(optimizer=optimizer, dense=dense, table=table).read(checkpoint_from).assert_consumed()
    ids = tf.constant([0, 3, 3, 1])
    for step in range(first_step, first_step + steps):
        with tf.GradientTape() as tape:
            rows = tf.gather(table, ids)  # gradient of `table`: IndexedSlices
            loss = tf.reduce_sum(tf.sin(tf.matmul(rows[:3, :3], dense) * (step + 1.0))) + tf.reduce_sum(rows ** 2)
        grads = tape.gradient(loss, [dense, table])
        optimizer.apply_gradients(zip(grads, [dense, table]))
    return dense, table, optimizer


def test_fused_adam_matches_keras_adam_on_dense_and_sparse_gradients():
    ref_dense, ref_table, _ = _train(keras.optimizers.Adam)
    dense, table, _ = _train(FusedAdam)
    np.testing.assert_allclose(dense.numpy(), ref_dense.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(table.numpy(), ref_table.numpy(), rtol=0, atol=1e-6)


def test_a_keras_adam_checkpoint_resumes_in_fused_adam(tmp_path):
    dense, table, optimizer = _train(keras.optimizers.Adam, steps=3)
    path = tf.train.Checkpoint(optimizer=optimizer, dense=dense, table=table).write(str(tmp_path / "ckpt"))
    resumed_dense, _, resumed = _train(FusedAdam, steps=2, checkpoint_from=path, first_step=3)
    continued_dense, _, _ = _train(keras.optimizers.Adam, steps=5)
    assert int(resumed.iterations.numpy()) == 5
    np.testing.assert_allclose(resumed_dense.numpy(), continued_dense.numpy(), rtol=0, atol=1e-6)


def test_the_update_makes_its_scalars_once_per_dtype_in_a_compiled_step():
    """β powers, lr and ε are made once per update and dtype, not once per variable (~10 graph ops
    each); the compiled update still equals Keras' Adam step after step."""

    def variables():
        values = [np.linspace(-1, 1, 6).reshape(2, 3) * (i + 1) for i in range(4)]
        return [keras.Variable(v.astype(np.float64 if i == 3 else np.float32), name=f"w{i}") for i, v in enumerate(values)]

    def train(optimizer_cls):
        weights = variables()
        optimizer = optimizer_cls(1e-2, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        optimizer.build(weights)

        @tf.function
        def step(scale):
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.cast(tf.reduce_sum(tf.sin(w * scale)), tf.float32) for w in weights])
            optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights))

        for i in range(3):
            step(tf.constant(i + 1.0))
        graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
        return weights, sum(op.type == "Pow" for op in graph.get_operations())

    weights, pows = train(FusedAdam)
    reference, _ = train(keras.optimizers.Adam)
    assert pows == 4  # β₁ᵗ and β₂ᵗ for float32 and for float64; was 2 per variable (8)
    for w, ref in zip(weights, reference):
        np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=0, atol=1e-6)
