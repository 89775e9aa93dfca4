"""The encoder-decoder Transformer (Keras 3 model).

Training call: `model((src_ids, tgt_in_ids))` → logits `[batch, tgt_len, tgt_vocab]`,
always float32 (the final projection runs in float32 under every precision policy).

Incremental decoding (used by transformer/inference/translator.py), KerasHub style:
    memory, src_mask = model.encode(src_ids)
    cache = model.init_cache(memory, src_mask, max_length)
    logits, cache, cross_scores = model.decode_step(token_ids, index, src_mask, cache)
Each step feeds only the new token(s) at position `index`; the encoder runs once and the
cross-attention keys/values are computed once.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from transformer.base.config import ModelConfig
from transformer.base.constants import PAD_ID
from transformer.model.accumulation import accumulated_train_step
from transformer.model.dropout import FastDropout
from transformer.model.layer_norm import LayerNorm
from transformer.model.layers import DecoderLayer, EncoderLayer, PositionalEmbedding
from transformer.model.logits import Logits
from transformer.model.tied import TiedLogits


@keras.saving.register_keras_serializable(package="transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer (Vaswani et al. 2017; TF tutorial layout).

    Args:
        num_layers, d_model, num_heads, dff, dropout_rate, head_width, max_length,
        src_vocab_size, tgt_vocab_size, tie_embeddings, layer_norm, attention_dropout,
        activation_dropout: see `transformer.base.config.ModelConfig` (the defaults are its defaults;
        the vocabulary sizes must be given).

    With layer_norm "pre", the encoder output and the decoder output each get a final
    LayerNorm (`encoder_norm`, `decoder_norm`; `transformer.model.layer_norm`). With tie_embeddings "output" or
    "all" the projection is a `transformer.model.tied.TiedLogits` over the target embedding.

    Call arguments:
        inputs: tuple `(src_ids [batch, src_len], tgt_in_ids [batch, tgt_len])`, int, pad 0.
        training: bool.

    Returns:
        logits `[batch, tgt_len, tgt_vocab_size]` float32.
    """

    def __init__(self, num_layers=ModelConfig.num_layers, d_model=ModelConfig.d_model,
                 num_heads=ModelConfig.num_heads, dff=ModelConfig.dff, dropout_rate=ModelConfig.dropout_rate,
                 head_width=ModelConfig.head_width, max_length=ModelConfig.max_length,
                 src_vocab_size=ModelConfig.src_vocab_size, tgt_vocab_size=ModelConfig.tgt_vocab_size,
                 tie_embeddings=ModelConfig.tie_embeddings, layer_norm=ModelConfig.layer_norm,
                 attention_dropout=ModelConfig.attention_dropout, activation_dropout=ModelConfig.activation_dropout,
                 **kwargs):
        super().__init__(**kwargs)
        if src_vocab_size <= 0 or tgt_vocab_size <= 0:
            raise ValueError(f"src_vocab_size and tgt_vocab_size must be > 0 (the tokenizers' vocabulary sizes), "
                             f"got {src_vocab_size} and {tgt_vocab_size}")
        self.config = ModelConfig(
            num_layers=num_layers, d_model=d_model, num_heads=num_heads, dff=dff,
            dropout_rate=dropout_rate, head_width=head_width, max_length=max_length,
            src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, tie_embeddings=tie_embeddings,
            layer_norm=layer_norm, attention_dropout=attention_dropout, activation_dropout=activation_dropout,
        )
        self.config.validate()
        policy = self.dtype_policy
        pre_norm = layer_norm == "pre"
        layer_args = dict(d_model=d_model, num_heads=num_heads, key_dim=self.config.key_dim, dff=dff,
                          dropout_rate=dropout_rate, pre_norm=pre_norm, attention_dropout=attention_dropout,
                          activation_dropout=activation_dropout, dtype=policy)
        self.tgt_embedding = PositionalEmbedding(tgt_vocab_size, d_model, max_length, dtype=policy, name="tgt_embedding")
        shared = self.tgt_embedding.embedding if tie_embeddings == "all" else None
        self.src_embedding = PositionalEmbedding(src_vocab_size, d_model, max_length, embedding=shared, dtype=policy,
                                                 name="src_embedding")
        self.src_dropout = FastDropout(dropout_rate, dtype=policy, name="src_dropout")
        self.tgt_dropout = FastDropout(dropout_rate, dtype=policy, name="tgt_dropout")
        # One attribute per block, not a list: on the TensorFlow backend Keras 3 wraps list
        # attributes in a TrackedList that tf.train.Checkpoint does not follow, so blocks held
        # in a list would be silently missing from `tf.train.Checkpoint(model=...)`.
        for i in range(num_layers):
            setattr(self, f"encoder_{i}", EncoderLayer(**layer_args, name=f"encoder_{i}"))
        for i in range(num_layers):
            setattr(self, f"decoder_{i}", DecoderLayer(**layer_args, name=f"decoder_{i}"))
        # Final norms of the pre-norm stacks (a pre-norm block's output is un-normalised).
        self.encoder_norm = LayerNorm(dtype=policy, name="encoder_norm") if pre_norm else None
        self.decoder_norm = LayerNorm(dtype=policy, name="decoder_norm") if pre_norm else None
        # float32 logits: softmax/loss stay accurate under mixed_float16 / mixed_bfloat16; a bfloat16
        # model's training calls run the projection's gradient products in bfloat16 (model/logits.py).
        grad_dtype = "bfloat16" if policy.compute_dtype == "bfloat16" else None
        if tie_embeddings == "none":
            self.final_layer = Logits(tgt_vocab_size, grad_dtype=grad_dtype, name="logits")
        else:
            self.final_layer = TiedLogits(self.tgt_embedding.embedding, grad_dtype=grad_dtype, name="logits")

    @property
    def encoder_layers(self) -> list:
        return [getattr(self, f"encoder_{i}") for i in range(self.config.num_layers)]

    @property
    def decoder_layers(self) -> list:
        return [getattr(self, f"decoder_{i}") for i in range(self.config.num_layers)]

    @classmethod
    def from_model_config(cls, config: ModelConfig, **kwargs) -> "Transformer":
        fields = {k: getattr(config, k) for k in config.__dataclass_fields__}
        return cls(**fields, **kwargs)

    def build(self, input_shape=None):
        src_shape, tgt_shape = (None, None), (None, None)
        self.src_embedding.build(src_shape)
        self.tgt_embedding.build(tgt_shape)
        hidden = (None, None, self.config.d_model)
        for layer in self.encoder_layers:
            layer.build(hidden)
        for layer in self.decoder_layers:
            layer.build(hidden, hidden)
        for norm in (self.encoder_norm, self.decoder_norm):
            if norm is not None:
                norm.build(hidden)
        self.final_layer.build(hidden)
        self.built = True

    # ---- full-sequence passes -------------------------------------------------------
    def call(self, inputs, training=None):
        src_ids, tgt_ids = inputs
        memory, src_mask = self.encode(src_ids, training=training)
        logits, _ = self.decode(tgt_ids, memory, src_mask, training=training)
        return logits

    accumulate_steps = 1  # micro-batches per optimizer update (`compile_model`, --accumulate-steps)

    def train_step(self, data):
        """Keras' training step; with `accumulate_steps` > 1 one update from that many micro-batches
        of the batch (transformer/model/accumulation.py)."""
        if self.accumulate_steps == 1:
            return super().train_step(data)
        return accumulated_train_step(self, data, self.accumulate_steps)

    def test_step(self, data):
        """Keras' evaluation step, with the batch's loss weighted by its real rows.

        Keras weighs each batch's loss by its row count in the epoch's mean; evaluation batches
        padded to a fixed row count with all-pad rows (transformer/data/pipeline.py, for XLA) would
        give those rows weight. Here a row counts when it holds a target token, as every row of
        an unpadded batch does, so unpadded batches give Keras' own result. Masked loss and
        metrics already ignore pad tokens.
        """
        inputs, target, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None:
            return super().test_step(data)
        logits = self(inputs, training=False)
        loss = self.compute_loss(x=inputs, y=target, y_pred=logits, training=False)
        rows = tf.reduce_sum(tf.cast(tf.reduce_any(tf.not_equal(target, PAD_ID), axis=-1), loss.dtype))
        replicas = tf.distribute.get_strategy().num_replicas_in_sync  # as Keras: unscaled for distribution
        self._loss_tracker.update_state(loss * tf.cast(replicas, loss.dtype), sample_weight=rows)
        return self.compute_metrics(inputs, target, logits)

    def encode(self, src_ids, training=None):
        """`[batch, src_len]` ids → (memory `[batch, src_len, d_model]`, src_mask bool `[batch, src_len]`)."""
        src_mask = tf.not_equal(src_ids, PAD_ID)
        x = self.src_dropout(self.src_embedding(src_ids), training=training)
        attention_mask = src_mask[:, tf.newaxis, :]  # [B, 1, S]
        for layer in self.encoder_layers:
            x = layer(x, attention_mask=attention_mask, training=training)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return x, src_mask

    def decode(self, tgt_ids, memory, src_mask, training=None):
        """Teacher-forced decoder pass → (logits `[B, T, V]` float32, last cross scores `[B, heads, T, S]`)."""
        length = tf.shape(tgt_ids)[1]
        causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)  # [T, T] lower triangle
        self_mask = causal[tf.newaxis] & tf.not_equal(tgt_ids, PAD_ID)[:, tf.newaxis, :]
        cross_mask = src_mask[:, tf.newaxis, :]
        x = self.tgt_dropout(self.tgt_embedding(tgt_ids), training=training)
        cross_scores = None
        for layer in self.decoder_layers:
            x, cross_scores, _ = layer(x, memory, self_attention_mask=self_mask,
                                       cross_attention_mask=cross_mask, training=training)
        return self.logits(x, training=training), cross_scores

    # ---- incremental decoding ---------------------------------------------------------
    def init_cache(self, memory, src_mask, max_length: int):
        """Empty self-attention caches and filled cross-attention caches, one per layer.

        Returns a dict: `self` → list of `[B, 2, max_length, heads, key_dim]` zeros,
        `cross` → list of `[B, 2, src_len, heads, key_dim]`. When key_dim >= d_model
        (head_width "tutorial") the caches hold layer inputs instead (`self` → `[B,
        max_length, d_model]` zeros, `cross` → the memory `[B, src_len, d_model]`), with
        keys/values implicit: the same result for the same FLOPs, and a decoding step reads
        2·heads·key_dim / d_model (16) times less cache memory (see
        `CachedMultiHeadAttention.attend_inputs`).
        """
        batch = tf.shape(memory)[0]
        if self.config.key_dim >= self.config.d_model:
            shape = [batch, max_length, self.config.d_model]
            return {"self": [tf.zeros(shape, dtype=self.compute_dtype) for _ in self.decoder_layers],
                    "cross": [memory for _ in self.decoder_layers]}
        shape = [batch, 2, max_length, self.config.num_heads, self.config.key_dim]
        return {
            "self": [tf.zeros(shape, dtype=self.compute_dtype) for _ in self.decoder_layers],
            "cross": [layer.cross_cache_for(memory) for layer in self.decoder_layers],
        }

    def decode_step(self, token_ids, index, src_mask, cache):
        """Decodes `token_ids [B, U]` placed at positions `index … index+U-1`.

        Returns (logits `[B, U, V]` float32, updated cache, last layer's cross-attention
        scores `[B, heads, U, src_len]`).
        """
        steps = tf.shape(token_ids)[1]
        max_length = tf.shape(cache["self"][0])[-3 if cache["self"][0].shape.rank == 5 else 1]
        query_pos = index + tf.range(steps)
        self_mask = tf.range(max_length)[tf.newaxis, :] <= query_pos[:, tf.newaxis]  # [U, L]
        self_mask = self_mask[tf.newaxis]
        cross_mask = src_mask[:, tf.newaxis, :]
        x = self.tgt_embedding(token_ids, start_index=index)
        new_self, cross_scores = [], None
        for layer, self_cache, cross_cache in zip(self.decoder_layers, cache["self"], cache["cross"]):
            x, cross_scores, self_cache = layer(
                x, None, self_attention_mask=self_mask, cross_attention_mask=cross_mask,
                self_cache=self_cache, cross_cache=cross_cache, cache_update_index=index)
            new_self.append(self_cache)
        return self.logits(x), {"self": new_self, "cross": cache["cross"]}, cross_scores

    def logits(self, x, training=None):
        """Decoder output `[B, T, d_model]` → logits `[B, T, V]` float32 (final norm if pre-norm)."""
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.final_layer(x, training=training)

    def get_config(self):
        base = super().get_config()
        fields = {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}
        return {**{k: v for k, v in base.items() if k in ("name", "trainable", "dtype")}, **fields}
