"""The decoder's one-token inference step, lean: few ops, caches that hold only filled positions.

    decoder = StepDecoder(model)
    context, cache = decoder.start(memory, src_mask)          # once per batch
    logits, cache, cross_scores = decoder.step(context, ids, index, cache)   # once per token

Same function as `Transformer.decode_step` for one new token per row (inference: no
dropout), computed from the same variables with fewer and cheaper ops, because on a CPU
without XLA a decoding step is a few hundred small kernels and their count and memory traffic
cost more than the arithmetic:
  - the self-attention cache of a layer is `(keys, values)`, each `[batch, heads, filled,
    key_dim]`, heads first (no transposes per step) and *grown* by one position per step: a
    step attends over the filled positions only, needs no causal mask, and copies
    `filled` positions instead of rewriting a fixed `[batch, 2, max_length, …]` cache;
  - queries, keys and values of the new token come from one `[d_model, 3·heads·key_dim]`
    matmul on `[batch, d_model]` rows; that weight and the FFN's inner one get 16 zero
    columns when their float32 width is a multiple of 512 (`padded_width`), whose outputs
    are dropped;
  - cross-attention keys/values `[batch, heads, src_len, key_dim]`, the source-padding bias and
    every weight in its step layout (the layer norms' gamma and beta too) are computed once in
    `start`; every projection is a plain 2-D matmul; a new key or value joins its cache by a
    reshape (`[B, N·H]` → `[B, N, 1, H]`, no transpose for one position); layer norms are the
    model's own ops (`layer_norm_value`, 9 per norm), so a step reads no variable and runs
    ~190 ops (float32, 3 layers) where it ran 259;
  - beam search (`group` hypotheses per source row) keeps them per source row, untiled: the
    group's queries attend together, `[group, key_dim] × [key_dim, src_len]` per head, so
    the keys/values are read once per sentence, not once per hypothesis;
  - beam search's self-attention cache can be kept by beam slot (`slot_cache`, `[batch,
    heads, group, filled, key_dim]`) and never reordered: given each hypothesis's lineage (the
    slot holding each of its positions), the group's queries attend over all slots' positions
    with the others' masked, instead of a gather of every cache by beam parent per step.
Numerics follow the model's: weights and matmuls in its compute dtype (bfloat16 for a
`cast_model` copy), attention logits, softmax, layer norms and the output projection in
float32, logits float32. `projection_dtype="bfloat16"` runs the output projection's matmul
in bfloat16 too (TensorFlow's CPU matmul returns bfloat16, so the logits are rounded to
bfloat16 before the float32 bias; it changes translations); "auto" picks it for a bfloat16
model and float32 for a float32 one. The caches' growing
length makes the step unfit for XLA, which needs static shapes: the XLA decode loop uses
`Transformer.decode_step` (fixed-size cache).
`tests/model/test_step_decoder.py` checks it against `decode_step` and the full pass.
"""

from __future__ import annotations

import math
from typing import Sequence

import tensorflow as tf

from transformer.model.layer_norm import layer_norm_value
from transformer.model.layers import NEG_INF, dense_matrix

# A float32 matmul whose weight is `[k, n]` with n a multiple of 512 (rows 2 KiB apart) ran
# 1.2-2.1x slower than with 16 more columns, at every row count of a step (AMD EPYC Zen 3; the
# weight's rows alias in the cache; docs/speed.md, "Matrix shapes"): the step gives such
# weights `ALIASING_PAD` zero columns and drops the extra outputs (a free split, or a slice).
ALIASING_WIDTH = 512
ALIASING_PAD = 16


def padded_width(width: int, dtype) -> int:
    """Columns for a step weight of `width` outputs: `width` + `ALIASING_PAD` when float32 and a
    multiple of `ALIASING_WIDTH`, else `width` (bfloat16 kernels were not measured)."""
    if tf.as_dtype(dtype) == tf.float32 and width % ALIASING_WIDTH == 0:
        return width + ALIASING_PAD
    return width


def _pad_columns(matrix, bias, width: int):
    """`[k, n]` matrix and `[n]` bias with zero columns up to `width` (the extra outputs are 0)."""
    extra = width - matrix.shape[-1]
    if extra == 0:
        return matrix, bias
    return tf.pad(matrix, [[0, 0], [0, extra]]), tf.pad(bias, [[0, extra]])


def _read(variable, dtype) -> tf.Tensor:
    """A variable's value in `dtype`."""
    return tf.cast(tf.convert_to_tensor(variable), dtype)


def _norm_weights(layer) -> tuple:
    """A LayerNorm's (gamma, beta) float32 `[d]` and epsilon, read once per batch (`start`)."""
    return _read(layer.gamma, tf.float32), _read(layer.beta, tf.float32), float(layer.epsilon)


def _norm(x, weights) -> tf.Tensor:
    """LayerNorm (last axis) with `_norm_weights`, the model's own ops (`layer_norm_value`), in x's dtype."""
    gamma, beta, epsilon = weights
    return layer_norm_value(x, gamma, beta, epsilon)


def _merge_slots(x) -> tf.Tensor:
    """`[B, N, G, T, H]` → `[B, N, G·T, H]` (a reshape: slot g's position t at g·T + t)."""
    shape = tf.shape(x)
    return tf.reshape(x, [shape[0], shape[1], shape[2] * shape[3], shape[4]])


def _lineage_bias(lineage, group: int) -> tf.Tensor:
    """Self-attention bias of hypotheses over their row's slots: lineage int32 `[B, G, T]` →
    float32 `[B, 1, G, G·T]`, 0 where slot g' holds position t of hypothesis g, else NEG_INF
    (laid out as `_merge_slots`)."""
    ancestor = tf.one_hot(lineage, group, on_value=0.0, off_value=NEG_INF)  # [B, G, T, G']
    bias = tf.transpose(ancestor, [0, 1, 3, 2])  # [B, G, G', T]
    shape = tf.shape(bias)
    return tf.reshape(bias, [shape[0], 1, group, group * shape[3]])


def resolve_projection_dtype(projection_dtype: str, compute_dtype) -> str:
    """The output projection's matmul dtype for `projection_dtype` ("auto", "float32" or
    "bfloat16") on a model computing in `compute_dtype`: "auto" is bfloat16 for a bfloat16
    model (its projection on bfloat16 matrix units: 1.12-1.15x the sentences/s of a float32
    projection on an AMX Xeon, BLEU within 0.05; docs/speed.md) and float32 otherwise."""
    if projection_dtype == "auto":
        return "bfloat16" if tf.as_dtype(compute_dtype) == tf.bfloat16 else "float32"
    if projection_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"projection_dtype must be auto, float32 or bfloat16, got {projection_dtype!r}")
    return projection_dtype


class StepDecoder:
    """One-token decoding steps of a `transformer.model.transformer.Transformer` (see module docstring).

    Args:
        model: the built Transformer; its variables are read at every `start` (so a changed
            weight is seen) and never copied into this object.
        projection_dtype: str. The output projection's matmul dtype: "float32" (default),
            "bfloat16" (logits rounded to bfloat16, returned as float32), or "auto": the
            model's compute dtype (`resolve_projection_dtype`).
        forbidden_ids: token ids never to be generated: their logits are NEG_INF, written into
            the projection's bias once per batch (`start`), so a step pays nothing for them
            (masking the `[rows, vocab]` logits cost ~4% of a float32 step at 64 rows).
    """

    def __init__(self, model, projection_dtype: str = "float32", forbidden_ids: Sequence[int] = ()):
        self.model = model
        config = model.config
        self.heads, self.key_dim, self.d_model = config.num_heads, config.key_dim, config.d_model
        self.dtype = tf.as_dtype(model.compute_dtype)
        self.projection_dtype = tf.as_dtype(resolve_projection_dtype(projection_dtype, self.dtype))
        self.forbidden_ids = tuple(int(i) for i in forbidden_ids)
        width = self.heads * self.key_dim
        padding = padded_width(3 * width, self.dtype) - 3 * width
        self._qkv_split = [width] * 3 + ([padding] if padding else [])

    # ---- per batch ---------------------------------------------------------------------
    def start(self, memory, src_mask):
        """The step's constants and an empty cache for a batch.

        Args:
            memory: encoder output `[batch, src_len, d_model]`.
            src_mask: bool `[batch, src_len]`, True at real source tokens.

        Returns:
            (context, cache). context: dict with "weights" (per decoder layer, shared by every
            row: matrices, biases and the layer norms' (gamma, beta, epsilon)), "output" (the
            projection's matrix and bias), "final_norm" (the decoder's last norm or None),
            "cross" (per layer (keys, values) `[batch, heads, src_len, key_dim]`) and "bias"
            (float32 `[batch, 1, 1, src_len]`: 0 or NEG_INF); the rows' parts ("cross", "bias")
            are what beam search tiles. cache: per layer (keys, values) `[batch, heads, 0, key_dim]`.
        """
        batch = tf.shape(memory)[0]
        weights = [self._layer_weights(layer) for layer in self.model.decoder_layers]
        memory = tf.cast(memory, self.dtype)
        cross = []
        for layer, w in zip(self.model.decoder_layers, weights):
            keys = self._split_heads(self._dense(memory, w["cross_k"], w["cross_k_bias"]))  # [B, N, S, H]
            values = self._split_heads(self._dense(memory, w["cross_v"], w["cross_v_bias"]))
            cross.append((keys, values))
        bias = tf.where(src_mask, 0.0, NEG_INF)[:, tf.newaxis, tf.newaxis, :]  # [B, 1, 1, S] float32
        empty = tf.zeros([batch, self.heads, 0, self.key_dim], self.dtype)
        final_norm = self.model.decoder_norm
        context = {"weights": weights, "cross": cross, "bias": bias, "output": self._output_weights(),
                   "final_norm": None if final_norm is None else _norm_weights(final_norm)}
        return context, [(empty, empty) for _ in weights]

    def slot_cache(self, batch, group: int) -> list:
        """An empty cache kept by beam slot (see `step`'s `lineage`): per layer (keys, values)
        `[batch, heads, group, 0, key_dim]`, one entry per source row and slot."""
        empty = tf.zeros([batch, self.heads, group, 0, self.key_dim], self.dtype)
        return [(empty, empty) for _ in self.model.decoder_layers]

    def cache_shape_invariants(self, cache) -> list:
        """`tf.while_loop` shape invariants of a cache (`start`'s or `slot_cache`'s): batch and
        filled length vary."""
        slots = [cache[0][0].shape[2]] if cache and cache[0][0].shape.rank == 5 else []
        shape = tf.TensorShape([None, self.heads, *slots, None, self.key_dim])
        return [(shape, shape) for _ in cache]

    # ---- per token ---------------------------------------------------------------------
    def step(self, context, ids, index, cache, group: int = 1, lineage=None, self_bias=None):
        """Decodes one token per row.

        Args:
            context: from `start` for `batch` source rows (rows tiled alike when the batch is tiled).
            ids: int `[batch · group]`, the tokens at position `index`; row `b · group + j` is
                hypothesis j of source row b.
            index: int32 scalar, their position (= the cache's filled length), or int32
                `[batch]`, each row's position (rows whose caches hold different histories;
                with `self_bias`).
            cache: per layer (keys, values) `[batch · group, heads, index, key_dim]`, one entry
                per hypothesis; with `lineage`, `slot_cache`'s `[batch, heads, group, index,
                key_dim]`, one entry per beam slot, never reordered.
            group: int. Hypotheses per source row (the beam size); 1: one row per source row.
            lineage: None, or int32 `[batch, group, index + 1]`: for hypothesis j of a source
                row, the slot whose cache entry holds its position t (`j` itself at `index`).
                Each hypothesis then attends over its row's `group` slots with the other
                slots' positions masked (bias NEG_INF: softmax weight exactly 0), so beam
                search never gathers the caches by parent (a copy of every cache per step).
            self_bias: None, or float32 `[batch, 1, 1, index + 1]` added to the self-attention
                logits (0 or NEG_INF: which filled positions each row sees); not with `lineage`.

        Returns:
            (logits `[batch · group, vocab]` float32, cache with `index + 1` positions, last
            layer's cross-attention `[batch · group, heads, src_len]` float32).
        """
        embedding = self.model.tgt_embedding
        x = tf.cast(tf.gather(embedding.embedding.embeddings, ids), self.dtype)  # [B, d]
        x = x * tf.cast(math.sqrt(self.d_model), self.dtype)
        x = x + tf.cast(embedding.position_encoding(index), self.dtype)
        new_cache, scores = [], None
        if lineage is not None:
            if self_bias is not None:
                raise ValueError("StepDecoder.step takes a lineage or a self_bias, not both")
            self_bias = _lineage_bias(lineage, group)  # [B, 1, G, G·(T+1)]
        for layer, w, (cross_k, cross_v), (keys, values) in zip(
                self.model.decoder_layers, context["weights"], context["cross"], cache):
            h = _norm(x, w["self_norm"]) if layer.pre_norm else x
            qkv = self._dense(h, w["qkv"], w["qkv_bias"])  # [B, 3·N·H (+ padding)]
            query, key, value = tf.split(qkv, self._qkv_split, axis=-1)[:3]  # [B, N·H] each
            query = query * w["scale"]
            if lineage is None:
                keys = tf.concat([keys, self._new_position(key)], axis=2)  # [B, N, T+1, H]
                values = tf.concat([values, self._new_position(value)], axis=2)
                attended, _ = self._attend(query, keys, values, self_bias)
            else:
                keys = tf.concat([keys, self._slot_heads(key, group)], axis=3)  # [B, N, G, T+1, H]
                values = tf.concat([values, self._slot_heads(value, group)], axis=3)
                attended, _ = self._attend_group(query, _merge_slots(keys), _merge_slots(values), self_bias, group)
            x = self._residual(layer, w["self_norm"], x, self._dense(attended, w["self_o"], w["self_o_bias"]))
            h = _norm(x, w["cross_norm"]) if layer.pre_norm else x
            query = self._dense(h, w["cross_q"], w["cross_q_bias"]) * w["scale"]
            if group == 1:
                attended, scores = self._attend(query, cross_k, cross_v, context["bias"])
            else:
                attended, scores = self._attend_group(query, cross_k, cross_v, context["bias"], group)
            x = self._residual(layer, w["cross_norm"], x, self._dense(attended, w["cross_o"], w["cross_o_bias"]))
            h = _norm(x, w["ffn_norm"]) if layer.pre_norm else x
            inner = self._dense(h, w["ffn_inner"], w["ffn_inner_bias"])  # [B, dff (+ padding)]
            inner = tf.nn.relu(inner[:, :layer.dff] if inner.shape[-1] != layer.dff else inner)
            x = self._residual(layer, w["ffn_norm"], x, self._dense(inner, w["ffn_outer"], w["ffn_outer_bias"]))
            new_cache.append((keys, values))
        if context["final_norm"] is not None:
            x = _norm(x, context["final_norm"])
        matrix, bias = context["output"]
        logits = tf.cast(tf.matmul(tf.cast(x, matrix.dtype), matrix), tf.float32) + bias  # [B, V] float32
        return logits, new_cache, scores[:, :, 0, :]

    # ---- pieces --------------------------------------------------------------------------
    def _split_heads(self, x):
        """`[B, T, N·H]` → `[B, N, T, H]`."""
        shape = tf.shape(x)
        return tf.transpose(tf.reshape(x, [shape[0], shape[1], self.heads, self.key_dim]), [0, 2, 1, 3])

    def _new_position(self, x):
        """`[B, N·H]` → `[B, N, 1, H]`: one new position, heads first (a reshape: no transpose for one position)."""
        return tf.reshape(x, [-1, self.heads, 1, self.key_dim])

    def _slot_heads(self, x, group: int):
        """`[B·G, N·H]` → `[B, N, G, 1, H]`: one new position per slot, heads first."""
        x = tf.transpose(tf.reshape(x, [-1, group, self.heads, self.key_dim]), [0, 2, 1, 3])  # [B, N, G, H]
        return x[:, :, :, tf.newaxis, :]

    def _dense(self, x, kernel, bias):
        return tf.matmul(x, kernel) + bias if x.shape.rank == 2 else tf.einsum("btd,de->bte", x, kernel) + bias

    def _attend(self, query, keys, values, bias):
        """query `[B, N·H]` (scaled), keys/values `[B, N, T, H]` → (`[B, N·H]`, scores `[B, N, 1, T]` float32)."""
        query = tf.reshape(query, [-1, self.heads, 1, self.key_dim])
        logits = tf.cast(tf.matmul(query, keys, transpose_b=True), tf.float32)  # [B, N, 1, T]
        if bias is not None:
            logits += bias
        scores = tf.nn.softmax(logits)
        attended = tf.matmul(tf.cast(scores, self.dtype), values)  # [B, N, 1, H]
        return tf.reshape(attended, [-1, self.heads * self.key_dim]), scores

    def _attend_group(self, query, keys, values, bias, group: int):
        """`_attend` for `group` queries per row of keys/values: query `[B·G, N·H]` (scaled), keys/values
        `[B, N, S, H]`, bias `[B, 1, 1, S]` or per query `[B, 1, G, S]` → (`[B·G, N·H]`, scores
        `[B·G, N, 1, S]` float32)."""
        query = tf.transpose(tf.reshape(query, [-1, group, self.heads, self.key_dim]), [0, 2, 1, 3])  # [B, N, G, H]
        logits = tf.cast(tf.matmul(query, keys, transpose_b=True), tf.float32) + bias  # [B, N, G, S]
        scores = tf.nn.softmax(logits)
        attended = tf.matmul(tf.cast(scores, self.dtype), values)  # [B, N, G, H]
        attended = tf.reshape(tf.transpose(attended, [0, 2, 1, 3]), [-1, self.heads * self.key_dim])
        scores = tf.transpose(scores, [0, 2, 1, 3])  # [B, G, N, S]
        return attended, tf.reshape(scores, [-1, self.heads, 1, tf.shape(scores)[-1]])

    @staticmethod
    def _residual(layer, norm_weights, x, update):
        return x + update if layer.pre_norm else _norm(x + update, norm_weights)

    def _layer_weights(self, layer) -> dict:
        """A decoder layer's variables as 2-D matrices in the compute dtype (the query/key/value
        and FFN inner weights with `padded_width` columns), and the query scale."""
        width, dtype = self.heads * self.key_dim, self.dtype
        scale = 1.0 / math.sqrt(float(self.key_dim))  # CachedMultiHeadAttention._inverse_sqrt_key_dim

        def kernel(dense, inputs=1):
            return dense_matrix(dense, dtype, inputs)[0]

        def bias(dense, inputs=1):
            return dense_matrix(dense, dtype, inputs)[1]

        mine, cross = layer.self_attention, layer.cross_attention
        scale = tf.cast(scale, dtype)
        qkv, qkv_bias = _pad_columns(  # [d, 3·N·H (+ padding)]
            tf.concat([kernel(mine._query_dense), kernel(mine._key_dense), kernel(mine._value_dense)], axis=1),
            tf.concat([bias(mine._query_dense), bias(mine._key_dense), bias(mine._value_dense)], axis=0),
            padded_width(3 * width, dtype))
        ffn_inner, ffn_inner_bias = _pad_columns(  # [d, dff (+ padding)]
            kernel(layer.ffn.inner), bias(layer.ffn.inner), padded_width(layer.dff, dtype))
        return {
            "scale": scale,
            "qkv": qkv, "qkv_bias": qkv_bias,
            "self_o": kernel(mine._output_dense, 2), "self_o_bias": bias(mine._output_dense, 2),
            "cross_q": kernel(cross._query_dense), "cross_q_bias": bias(cross._query_dense),
            "cross_k": kernel(cross._key_dense), "cross_k_bias": bias(cross._key_dense),
            "cross_v": kernel(cross._value_dense), "cross_v_bias": bias(cross._value_dense),
            "cross_o": kernel(cross._output_dense, 2), "cross_o_bias": bias(cross._output_dense, 2),
            "ffn_inner": ffn_inner, "ffn_inner_bias": ffn_inner_bias,
            "ffn_outer": kernel(layer.ffn.outer), "ffn_outer_bias": bias(layer.ffn.outer),
            "self_norm": _norm_weights(layer.self_attention_norm),
            "cross_norm": _norm_weights(layer.cross_attention_norm),
            "ffn_norm": _norm_weights(layer.ffn_norm),
        }

    def _output_weights(self):
        """(matrix `[d, V]` in `projection_dtype`, bias float32 `[V]`, NEG_INF at `forbidden_ids`):
        logits = x · matrix + bias."""
        final = self.model.final_layer
        if hasattr(final, "embedding"):  # TiedLogits: the target embedding `[V, d]`, transposed once per batch
            matrix = tf.transpose(_read(final.embedding.embeddings, self.projection_dtype))
        else:
            matrix = _read(final.kernel, self.projection_dtype)
        bias = _read(final.bias, tf.float32)
        if self.forbidden_ids:
            bias = tf.tensor_scatter_nd_update(bias, [[i] for i in self.forbidden_ids],
                                               tf.fill([len(self.forbidden_ids)], NEG_INF))
        return matrix, bias
