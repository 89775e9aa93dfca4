"""Tied embeddings: the output projection reuses a token embedding matrix (Press & Wolf 2017).

    logits = x · Eᵀ + b        E: the target embedding `[vocab, d_model]`, b: `[vocab]`

`ModelConfig.tie_embeddings` chooses what is tied:
    "none":   separate source embedding, target embedding and output projection (default);
    "output": the output projection is the target embedding, transposed (any vocabularies);
    "all":    additionally the source embedding *is* the target embedding: one matrix for
              input, output and softmax (needs a shared source/target vocabulary,
              `TokenizerConfig.shared_vocab`).

Mixed precision: the embedding variable is float32 (Keras keeps variables in float32), and
the projection casts the hidden states to float32 and multiplies in float32, so logits are
float32 under every policy, as with the untied float32 `Dense`.
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="transformer")
class TiedLogits(keras.layers.Layer):
    """Output projection against a (shared) `keras.layers.Embedding`'s matrix, plus a bias.

    Args:
        embedding: the built-or-to-be-built `keras.layers.Embedding` `[vocab, d_model]`
            whose matrix is the projection (not owned: its variable is created there, once).

    Call arguments:
        x: `[batch, length, d_model]` in any float dtype.

    Returns:
        logits `[batch, length, vocab]` float32.
    """

    def __init__(self, embedding, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.embedding = embedding

    def build(self, input_shape=None):
        self.bias = self.add_weight(shape=(self.embedding.input_dim,), initializer="zeros", name="bias")
        self.built = True

    def call(self, x):
        matrix = tf.convert_to_tensor(self.embedding.embeddings)  # [V, d] float32 variable
        logits = tf.einsum("btd,vd->btv", tf.cast(x, tf.float32), tf.cast(matrix, tf.float32))
        return logits + self.bias
