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

from typing import Optional

import keras

from transformer.model.logits import project
from transformer.runtime.fused_kernels import active_kernels


@keras.saving.register_keras_serializable(package="transformer")
class TiedLogits(keras.layers.Layer):
    """Output projection against a (shared) `keras.layers.Embedding`'s matrix, plus a bias.

    Args:
        embedding: the built-or-to-be-built `keras.layers.Embedding` `[vocab, d_model]`
            whose matrix is the projection (not owned: its variable is created there, once).
        grad_dtype: None, or "bfloat16" for a bfloat16 model: its training calls run the
            gradient products in it (`transformer.model.logits.project`).

    Call arguments:
        x: `[batch, length, d_model]` in any float dtype.

    Returns:
        logits `[batch, length, vocab]` float32.
    """

    def __init__(self, embedding, grad_dtype: Optional[str] = None, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.embedding = embedding
        self.grad_dtype = grad_dtype

    def build(self, input_shape=None):
        self.bias = self.add_weight(shape=(self.embedding.input_dim,), initializer="zeros", name="bias")
        self.built = True

    def call(self, x, training=None):
        grad_dtype, kernels = (self.grad_dtype, active_kernels()) if training else (None, None)
        return project(x, self.embedding.embeddings, self.bias, grad_dtype, transposed=True,  # embeddings [V, d] float32
                       kernels=kernels)
