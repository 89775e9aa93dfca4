"""Shared pieces of the model-invariant tests: tiny built models, id batches with trailing
padding, the causality probe and the step-by-step cached decoder."""

import keras
import numpy as np
import tensorflow as tf

from transformer.base.config import ModelConfig
from transformer.base.constants import PAD_ID
from transformer.model.transformer import Transformer

# The tiny model every model/decoding test starts from (overrides via dataclasses.replace).
TINY_MODEL = ModelConfig(num_layers=2, d_model=16, num_heads=2, dff=32, dropout_rate=0.0, head_width="tutorial",
                         max_length=16, src_vocab_size=40, tgt_vocab_size=48)

BATCH, SRC_LEN, TGT_LEN = 3, 7, 6


def moves_in_training(weight) -> bool:
    """False for the attention key biases: training never changes them (their gradient is exactly 0,
    `CachedMultiHeadAttention._project_training`), so their moving average equals them."""
    return not weight.path.endswith("/key/bias")


def build(config, seed: int = 0) -> Transformer:
    keras.utils.set_random_seed(seed)
    model = Transformer.from_model_config(config)
    model.build()
    return model


def random_ids(config, seed: int = 0):
    """(src [B, S], tgt [B, T]) int32 ids in [4, vocab); rows 1 and 2 end with padding."""
    rng = np.random.default_rng(seed)
    src = rng.integers(4, config.src_vocab_size, (BATCH, SRC_LEN)).astype("int32")
    tgt = rng.integers(4, config.tgt_vocab_size, (BATCH, TGT_LEN)).astype("int32")
    src[1, -2:] = PAD_ID
    src[2, -4:] = PAD_ID
    tgt[1, -1:] = PAD_ID
    tgt[2, -3:] = PAD_ID
    return src, tgt


def different_ids(ids: np.ndarray, vocab_size: int, seed: int = 1) -> np.ndarray:
    """Ids that differ from `ids` at every position (never pad)."""
    rng = np.random.default_rng(seed)
    shift = rng.integers(1, vocab_size - 4, ids.shape)
    return ((ids - 4 + shift) % (vocab_size - 4) + 4).astype(ids.dtype)


class NonCausalTransformer(Transformer):
    """The model with its causal mask removed (padding mask kept): the leak the tests must catch."""

    def decode(self, tgt_ids, memory, src_mask, training=None):
        self_mask = tf.not_equal(tgt_ids, PAD_ID)[:, tf.newaxis, :]  # [B, 1, T]: no causal part
        cross_mask = src_mask[:, tf.newaxis, :]
        x = self.tgt_dropout(self.tgt_embedding(tgt_ids), training=training)
        for layer in self.decoder_layers:
            x, _, _ = layer(x, memory, self_attention_mask=self_mask, cross_attention_mask=cross_mask,
                            training=training)
        return self.final_layer(x), None


def future_leak(model, src, tgt) -> float:
    """Largest change of logits at positions ≤ t when every target token after t is replaced."""
    base = model((src, tgt), training=False).numpy()
    vocab = model.config.tgt_vocab_size
    leak = 0.0
    for t in range(tgt.shape[1] - 1):
        changed = tgt.copy()
        changed[:, t + 1:] = different_ids(tgt, vocab, seed=t)[:, t + 1:]
        logits = model((src, changed), training=False).numpy()
        leak = max(leak, float(np.abs(logits[:, : t + 1] - base[:, : t + 1]).max()))
    return leak


def cached_logits(model, src, tgt, chunks, max_length):
    """Logits from model.decode_step, feeding `tgt` in chunks of the given sizes."""
    memory, src_mask = model.encode(src)
    cache = model.init_cache(memory, src_mask, max_length)
    shapes = [c.shape for c in cache["self"] + cache["cross"]]
    steps, index = [], 0
    for size in chunks:
        logits, cache, scores = model.decode_step(tgt[:, index: index + size], index, src_mask, cache)
        assert logits.shape == (tgt.shape[0], size, model.config.tgt_vocab_size)
        assert logits.dtype == tf.float32
        assert scores.shape == (tgt.shape[0], model.config.num_heads, size, src.shape[1])
        assert [c.shape for c in cache["self"] + cache["cross"]] == shapes  # fixed-size cache
        steps.append(logits.numpy())
        index += size
    assert index == tgt.shape[1]
    return np.concatenate(steps, axis=1)
