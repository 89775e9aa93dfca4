"""Transformer building blocks (Keras 3), mixed-precision safe and with explicit masks.

Masking is explicit everywhere: boolean `attention_mask` tensors `[batch, query_len,
key_len]` (or broadcastable), built by the model from the pad id. Keras' implicit mask
propagation (`mask_zero`) is deliberately not used: its semantics changed between Keras 2
and 3 (keras#20320), and MultiHeadAttention has silently dropped the causal mask with
dropout > 0 or returned scores (keras#23038). Tests prove causality and padding
invariance.

The query is scaled by 1/sqrt(key_dim) *before* the query·key product (which runs in the
compute dtype, keeping the matmul fast), then the logits are cast to float32 and the mask
and softmax are applied in float32 whatever the compute dtype, so a float16 masked softmax
cannot overflow (keras PR #17571).

The decoder supports a fixed-size key/value cache (KerasHub style): the self-attention
cache `[batch, 2, max_length, num_heads, key_dim]` is written at `cache_update_index` by one
scatter (`write_positions`); the cross-attention cache `[batch, 2, src_len, num_heads, key_dim]`
is filled once from the encoder output. A rank-3 cache `[batch, len, d_model]` holds the
attended inputs instead, with keys/values folded into the query and the context
(`CachedMultiHeadAttention.attend_inputs`); the model uses it when key_dim >= d_model.
One code path serves training and step-by-step decoding, and XLA sees static shapes.

Size: over ~350 lines on purpose: the attention, feed-forward, encoder and decoder blocks
share the mask and cache conventions above and are read together.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from transformer.model.affine import add_bias, affine, bias_row, uses_kernels, with_ones_column
from transformer.model.dropout import FastDropout, dropout_rate_and_seed, fast_dropout, no_dropout
from transformer.model.layer_norm import LayerNorm
from transformer.runtime.fused_kernels import active_kernels, small_product_kernels

NEG_INF = -1e9


def positional_encoding(length: int, depth: int) -> np.ndarray:
    """Sinusoidal table `[length, depth]` float32 (sin on even, cos on odd features)."""
    positions = np.arange(length)[:, np.newaxis]
    rates = 1.0 / np.power(10000.0, (2 * (np.arange(depth) // 2)) / depth)
    angles = positions * rates[np.newaxis, :]
    table = np.zeros((length, depth), dtype=np.float32)
    table[:, 0::2] = np.sin(angles[:, 0::2])
    table[:, 1::2] = np.cos(angles[:, 1::2])
    return table


@keras.saving.register_keras_serializable(package="transformer")
class PositionalEmbedding(keras.layers.Layer):
    """Token embedding × sqrt(d_model) + sinusoidal position encoding.

    Args:
        vocab_size: int. Number of token ids.
        d_model: int. Embedding width.
        max_length: int. Longest sequence (size of the position table).
        embedding: optional `keras.layers.Embedding` to use instead of a new one (shared
            source/target embeddings, see `transformer.model.tied`).

    Call arguments:
        token_ids: int tensor `[batch, seq_len]`.
        start_index: int scalar. Position of the first token (for cached decoding).

    Returns:
        `[batch, seq_len, d_model]` in the layer's compute dtype.
    """

    def __init__(self, vocab_size: int, d_model: int, max_length: int, embedding=None, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.max_length = max_length
        self.embedding = embedding or keras.layers.Embedding(vocab_size, d_model, dtype=self.dtype_policy,
                                                             name="token_embedding")
        self._table = positional_encoding(max_length, d_model)

    def build(self, input_shape):
        if not self.embedding.built:
            self.embedding.build(input_shape)
        super().build(input_shape)

    def call(self, token_ids, start_index=0):
        length = tf.shape(token_ids)[1]
        x = self.embedding(token_ids)
        x = x * tf.cast(math.sqrt(self.d_model), x.dtype)
        positions = tf.slice(tf.constant(self._table), [start_index, 0], [length, self.d_model])
        return x + tf.cast(positions, x.dtype)[tf.newaxis]

    def position_encoding(self, index) -> tf.Tensor:
        """The sinusoidal encoding of position `index` (int32 scalar): float32 `[d_model]`, as `call` adds it."""
        return tf.gather(tf.constant(self._table), index)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "max_length": self.max_length}


@keras.saving.register_keras_serializable(package="transformer")
class CachedMultiHeadAttention(keras.layers.MultiHeadAttention):
    """MultiHeadAttention with explicit boolean masks, float32 softmax and a KV cache.

    Call arguments:
        query: `[batch, query_len, dim]`.
        value: `[batch, key_len, dim]`; also the key.
        attention_mask: bool, broadcastable to `[batch, query_len, key_len]`; True = attend.
        cache: optional, either keys/values `[batch, 2, cache_len, num_heads, key_dim]` (keys
            at 0, values at 1), or the attended *inputs* `[batch, cache_len, dim]` (rank 3):
            keys/values are then implicit, see `attend_inputs`.
        cache_update_index: int scalar. With a cache: write this call's keys/values (or
            inputs) at this position (self-attention). None with a cache: the cache already
            holds them (cross-attention) and `value` is ignored.
        training: bool. Enables attention dropout.

    Returns:
        `output [batch, query_len, dim]`, plus `scores [batch, heads, query_len, key_len]`
        when `return_attention_scores`, plus the updated `cache` when one was given.
    """

    def call(self, query, value, attention_mask=None, cache=None, cache_update_index=None,
             training=None, return_attention_scores=False):
        if cache is not None and cache.shape.rank == 3:  # input cache: implicit keys/values
            if cache_update_index is not None:
                cache = write_positions(cache, value, cache_update_index)
            output, scores = self.attend_inputs(query, cache, attention_mask)
            return (output, scores, cache) if return_attention_scores else (output, cache)
        if training and cache is None and self.merges_heads(query, value):
            output, scores = self._attend_merged(query, value, attention_mask, return_attention_scores)
            return (output, scores) if return_attention_scores else output
        # Training's projections return the query already scaled by 1/sqrt(key_dim); inference's do not.
        project = self._project_training if training else self._project_heads
        if cache is None and value is query:  # self-attention: one matmul for queries, keys and values
            query_heads, key_heads, value_heads = project(query, (self._query_dense, self._key_dense, self._value_dense))
        elif cache is not None and cache_update_index is None:
            (query_heads,) = project(query, (self._query_dense,))  # [B, T, N, H]
            key_heads, value_heads = cache[:, 0], cache[:, 1]
        else:
            (query_heads,) = project(query, (self._query_dense,))
            key_heads, value_heads = project(value, (self._key_dense, self._value_dense))  # [B, S, N, H]
            if cache is not None:  # one scatter of this step's keys and values into [B, 2, L, N, H]
                cache = write_positions(cache, tf.stack([key_heads, value_heads], axis=1), cache_update_index, axis=2)
                key_heads, value_heads = cache[:, 0], cache[:, 1]
        output, scores = self._attend(query_heads, key_heads, value_heads, attention_mask, training,
                                      query_scaled=bool(training))
        output = self._project_output(output, active_kernels() if training else None)
        results = (output,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def project_key_value(self, value):
        """Keys and values for a cross-attention cache: `[batch, 2, key_len, heads, key_dim]`."""
        return tf.stack(self._project_heads(value, (self._key_dense, self._value_dense)), axis=1)

    def _project_training(self, x, denses) -> list:
        """Training's input projections (`[B, T, dim]` → one `[B, T, N, H]` per dense): each
        EinsumDense's own einsum on its kernel in the compute dtype, with two exact cuts.

        - The query comes out scaled by 1/sqrt(key_dim): the scale multiplies the kernel and
          bias (`[dim, N, H]`, `[N, H]`) instead of the `[B, T, N, H]` activations, forward and
          backward.
        - The key bias is not added: it shifts every logit of a query by the same q·bk, which
          the softmax cancels, so its true gradient is 0 (autodiff returned ~1e-13). It gets
          exactly 0 here and stays in the model, as inference adds it.
        The query and value biases: in a bfloat16 call with the fused kernels, the kernel's last row
        times a column of ones on x (`affine.bias_row`: no pass over the heads, the bias gradient
        out of the kernel's product); else `affine.add_bias`.
        Without the two ops the tutorial's bfloat16 step (heads `[B, T, 8, 128]`) ran 1.042x as
        fast, the default model's 1.018x (docs/speed.md, "What each optimisation measured"). Einsum, not a 2-D matmul: training
        takes dynamic shapes, where TensorFlow's einsum is one oneDNN matmul (see `_project_heads`).
        """
        dtype = self.compute_dtype
        kernels = active_kernels()
        x_ones = None  # x with a column of ones, made once for the query and value
        heads = []
        for dense in denses:
            kernel, bias = dense.kernel, dense.bias
            if dense is self._query_dense:
                kernel = kernel * self._inverse_sqrt_key_dim
                bias = None if bias is None else bias * self._inverse_sqrt_key_dim
            kernel = tf.cast(kernel, dtype)
            if bias is not None and dense is not self._key_dense and uses_kernels(x.dtype, kernels):
                x_ones = with_ones_column(x) if x_ones is None else x_ones
                heads.append(tf.einsum(dense.equation, x_ones, bias_row(kernel, bias)))
                continue
            y = tf.einsum(dense.equation, x, kernel)
            if bias is not None:
                y = _without_bias(y, bias) if dense is self._key_dense else add_bias(y, bias, kernels)
            heads.append(y)
        return heads

    def _project_heads(self, x, denses) -> list:
        """Inference's input projections `denses` (EinsumDense "abc,cde->abde", kernels `[dim, N,
        H]`) of `x [B, T, dim]` → one `[B, T, N, H]` per dense, computed as ONE 2-D matmul
        `[B·T, dim] × [dim, Σ N·H]` plus bias. Where the sequence length is static, Keras runs
        the layer's einsum as a batch matmul broadcasting the kernel over B (`[T, dim] × [dim,
        N·H]` per row): the encoder of a decoding chunk ran 1.21x faster this way on one core; a
        training step did not gain (docs/speed.md, "Matrix shapes"), so training keeps the einsum
        (`_project_training`). Same function, other rounding (~1e-6)."""
        matrices, biases = zip(*(dense_matrix(dense, x.dtype) for dense in denses))
        widths = [matrix.shape[1] for matrix in matrices]
        dim = x.shape[-1]
        y = tf.matmul(tf.reshape(x, [-1, dim]), tf.concat(matrices, axis=1)) + tf.concat(biases, axis=0)  # [B·T, Σ N·H]
        shape = tf.shape(x)
        return [tf.reshape(part, [shape[0], shape[1], *dense.kernel.shape[1:]])
                for part, dense in zip(tf.split(y, widths, axis=1), denses)]

    def _project_output(self, heads, kernels=None):
        """The output projection (EinsumDense "abcd,cde->abe", kernel `[N, H, dim]`) of
        `heads [B, T, N, H]` → `[B, T, dim]`, as one 2-D matmul (see `_project_heads`) plus bias:
        `affine`, which the remapper fuses into one kernel (or, with the fused CPU kernels of a
        training call, `kernels`, a plain product and `FusedBiasRelu`) and whose bias gradient is
        summed in float32 (training and inference alike)."""
        matrix, bias = dense_matrix(self._output_dense, heads.dtype, inputs=2)  # [N·H, dim], [dim]
        shape = tf.shape(heads)
        return affine(tf.reshape(heads, [shape[0], shape[1], matrix.shape[0]]), matrix, bias, kernels=kernels)

    def attend_inputs(self, query, inputs, attention_mask=None):
        """Attention over `inputs [B, S, dim]` without materialising per-head keys/values.

        Exact rewrite (inference: no attention dropout): q·(Wk x + bk) = (Wkᵀq)·x + q·bk, and
        q·bk is the same for every key, so the softmax drops it; Σ a·(Wv x + bv) =
        Wv·(Σ a·x) + bv since the weights sum to 1. A decoding step then reads `inputs`
        instead of keys and values of `heads · key_dim` each: 16x less memory traffic with
        head_width="tutorial" (key_dim = dim), for the same FLOPs.

        Returns (output `[B, T, dim]`, scores `[B, heads, T, S]` float32).
        """
        dtype = self.compute_dtype
        query_heads = self._query_dense(query) * tf.cast(self._inverse_sqrt_key_dim, dtype)  # [B, T, N, H]
        folded = tf.einsum("btnh,dnh->btnd", query_heads, tf.cast(self._key_dense.kernel, dtype))  # [B, T, N, dim]
        logits = tf.cast(tf.einsum("btnd,bsd->bnts", folded, tf.cast(inputs, dtype)), tf.float32)
        if attention_mask is not None:
            mask = rank3_mask(attention_mask)
            logits = tf.where(mask[:, tf.newaxis], logits, NEG_INF)
        scores = tf.nn.softmax(logits, axis=-1)  # [B, N, T, S]
        context = tf.einsum("bnts,bsd->btnd", tf.cast(scores, dtype), tf.cast(inputs, dtype))  # [B, T, N, dim]
        value_heads = tf.einsum("btnd,dnh->btnh", context, tf.cast(self._value_dense.kernel, dtype))
        if self._value_dense.bias is not None:
            value_heads += tf.cast(self._value_dense.bias, dtype)
        return self._output_dense(value_heads), scores

    def _attend(self, query_heads, key_heads, value_heads, attention_mask, training, query_scaled=False):
        # Heads to the front ([B, T, N, H] → [B, N, T, H]), then batched matmuls: on CPU
        # (oneDNN) explicit transposes + BatchMatMul run the attention block ~1.3x faster
        # than the equivalent einsums "btnh,bsnh->bnts" / "bnts,bsnh->btnh" (docs/speed.md,
        # "Where the time goes"). query_scaled: the query already carries 1/sqrt(key_dim).
        if not query_scaled:
            query_heads = query_heads * tf.cast(self._inverse_sqrt_key_dim, query_heads.dtype)
        # A training call without TensorFlow's oneDNN ops: float32 products by `SmallBatchMatMul`.
        kernels = small_product_kernels() if training else None
        query_heads = tf.transpose(query_heads, [0, 2, 1, 3])
        key_heads = tf.transpose(key_heads, [0, 2, 1, 3])
        logits = batch_matmul(kernels, query_heads, key_heads, adj_y=True)
        dropped, scores, _ = self._masked_softmax(logits, attention_mask, training)  # [B, N, T, S]
        output = batch_matmul(kernels, tf.cast(dropped, value_heads.dtype), tf.transpose(value_heads, [0, 2, 1, 3]))
        return tf.transpose(output, [0, 2, 1, 3]), scores  # [B, T, N, H]

    def _masked_softmax(self, logits, attention_mask, training, row_sums=False):
        """Mask, float32 softmax and attention dropout of `logits [B, N, T, S]` (compute dtype), the
        mask broadcastable to `[B, T, S]` (True: attend). Returns (dropped scores in the compute
        dtype (float32 without the fused kernels), scores float32, and with `row_sums` each row's
        sum of the dropped scores as the compute dtype rounds them, float32 `[B, N, T]`, else None).
        With the fused kernels (a training call): `FusedAttentionSoftmax`, one op each way, the
        sums included."""
        kernels = active_kernels() if training else None
        if kernels is not None and attention_mask is not None and logits.dtype in (tf.float32, tf.bfloat16, tf.float16):
            dropped, scores, sums = self._fused_softmax(kernels, logits, attention_mask)
            return dropped, tf.cast(scores, tf.float32), sums if row_sums else None
        compute_dtype = logits.dtype
        logits = tf.cast(logits, tf.float32)
        if attention_mask is not None:
            # An additive bias (0 or NEG_INF), built on the head-less mask: masked weights are
            # still exactly 0, and its gradient is the identity, where tf.where's backward
            # costs two selects over [B, N, T, S].
            mask = rank3_mask(attention_mask)
            logits += tf.where(mask, 0.0, NEG_INF)[:, tf.newaxis]
        scores = tf.nn.softmax(logits, axis=-1)
        # Keras' Dropout creates its seed generator only for a rate > 0.
        use_dropout = training and self._dropout > 0
        dropped = (fast_dropout(scores, self._dropout, self._dropout_layer.seed_generator,
                                getattr(self._dropout_layer, "dropout_switch", None)) if use_dropout else scores)
        sums = tf.reduce_sum(tf.cast(tf.cast(dropped, compute_dtype), tf.float32), axis=-1) if row_sums else None
        return dropped, scores, sums

    def merges_heads(self, query, value) -> bool:
        """Whether training attends with merged head matrices (`_attend_merged`): heads at least as
        wide as the inputs (the tutorial's key_dim = d_model), where merging saves work."""
        width = query.shape[-1]
        return (width is not None and value.shape[-1] == width and self._key_dim >= width
                and self._value_dim >= width)

    def _attend_merged(self, query, value, attention_mask, return_scores=False):
        """Training's attention with each head's query·key and value·output matrices merged.

        query `[B, T, d]`, value `[B, S, d]` (also the key). Exact rewrite of the per-head form
        (as `attend_inputs` for decoding), for heads at least d wide (`merges_heads`):
        - logits: q_n·k_n = (x_t Wq_n + bq_n)·(Wk_n x_s + bk_n) = x_t·(Wq_n Wk_nᵀ)·x_s + bq_n Wk_nᵀ·x_s
          + terms equal for every key, which the softmax drops. So `folded = x_t · QK + bias`
          (`QK = [Wq_n Wk_nᵀ]_n`, `[d, N·d]`) and the logits of batch row b are ONE product
          `folded_b [T·N, d] · value_bᵀ [d, S]`.
        - output: Σ_n (Σ_s a_s (x_s Wv_n + bv_n)) Wo_n = Σ_n (Σ_s a_s x_s)·(Wv_n Wo_n) + r_n·bv_n Wo_n,
          r_n = Σ_s a_s (1 without dropout): `context_b = a_b [T·N, S] · value_b [S, d]`, then one
          product with `VO [N·d, d]`.
        So a self-attention step makes two `[B·T, d] × [d, N·d]`-sized products where the per-head
        form makes four (queries, keys, values, output), and its attention products are one per
        batch row (`[T·N, d] × [d, S]`) instead of one per row and head (`[T, H] × [H, S]`,
        which oneDNN runs far below its peak), with no transposes. Same variables and
        checkpoints; other rounding. The key bias gets its exact gradient, 0.

        Returns (output `[B, T, d]`, scores `[B, N, T, S]` float32 when `return_scores`, else None).
        """
        dtype = self.compute_dtype
        kernels = active_kernels()
        heads, width = self._num_heads, query.shape[-1]
        wq, wk, wv = (tf.cast(dense.kernel, dtype) for dense in (self._query_dense, self._key_dense, self._value_dense))
        wo = tf.cast(self._output_dense.kernel, dtype)  # [N, H, d]
        wq = wq * tf.cast(self._inverse_sqrt_key_dim, dtype)
        qk = tf.reshape(tf.einsum("dnh,enh->dne", wq, wk), [width, heads * width])
        vo = tf.reshape(tf.einsum("dnh,nhe->nde", wv, wo), [heads * width, width])
        if self._query_dense.bias is not None:
            bq = tf.cast(self._query_dense.bias, dtype) * tf.cast(self._inverse_sqrt_key_dim, dtype)
            folded_bias = tf.reshape(tf.einsum("nh,enh->ne", bq, wk), [heads * width])
        else:
            folded_bias = tf.zeros([heads * width], dtype)
        folded = affine(query, qk, folded_bias, kernels=kernels)  # [B, T, N·d]
        if self._key_dense.bias is not None:
            folded = _without_bias(folded, self._key_dense.bias)
        shape = tf.shape(query)
        batch, length, keys = shape[0], shape[1], tf.shape(value)[1]
        value = tf.cast(value, dtype)
        small = small_product_kernels()  # see `_attend`
        logits = batch_matmul(small, tf.reshape(folded, [batch, length * heads, width]), value, adj_y=True)
        # Each query position is a batch row of the softmax: [B·T, N, 1, S], mask [B·T, 1, S].
        mask = None
        if attention_mask is not None:
            mask = rank3_mask(attention_mask)
            mask = tf.reshape(tf.broadcast_to(mask, [batch, length, keys]), [batch * length, 1, keys])
        with_value_bias = self._value_dense.bias is not None
        dropped, scores, weights = self._masked_softmax(tf.reshape(logits, [batch * length, heads, 1, keys]), mask,
                                                        training=True, row_sums=with_value_bias)
        dropped = tf.reshape(tf.cast(dropped, dtype), [batch, length * heads, keys])
        context = batch_matmul(small, dropped, value)  # [B, T·N, d]
        bo = self._output_dense.bias if self._output_dense.bias is not None else tf.zeros([width])
        output = affine(tf.reshape(context, [batch, length, heads * width]), vo, tf.cast(bo, dtype), kernels=kernels)
        if with_value_bias:  # r·bv_n Wo_n, r: the sums of the dropped weights, [B·T, N] (the kernel's third output)
            bvo = tf.einsum("nh,nhe->ne", tf.cast(self._value_dense.bias, dtype), wo)  # [N, d]
            output += tf.reshape(tf.matmul(tf.cast(tf.reshape(weights, [batch * length, heads]), dtype), bvo),
                                 [batch, length, width])
        if not return_scores:
            return output, None
        return output, tf.transpose(tf.reshape(scores, [batch, length, heads, keys]), [0, 2, 1, 3])

    def _fused_softmax(self, kernels, logits, attention_mask):
        """Training's mask + softmax + attention dropout by the fused kernels (one op each way).

        logits: `[B, N, T, S]` in the compute dtype; attention_mask: bool, broadcastable to
        `[B, T, S]`. Returns (dropped scores, scores) in logits' dtype and the rows' sums of the
        dropped scores, float32 `[B, N, T]`. The dropout rate is a
        tensor (0 while a late-dropout switch is off: no random numbers) and the seed comes from
        the Keras dropout's seed generator, as `fast_dropout`'s; the random stream differs
        from it (a hash of each element's position, not Philox).
        """
        shape = tf.shape(logits)
        mask = rank3_mask(attention_mask)
        mask = tf.broadcast_to(mask, [shape[0], shape[2], shape[3]])
        if self._dropout > 0:
            rate, seed = dropout_rate_and_seed(self._dropout_layer)
        else:
            rate, seed = no_dropout()
        return masked_softmax_dropout(kernels, logits, mask, rate, seed)


def masked_softmax_dropout(kernels, logits, mask, rate, seed):
    """`FusedAttentionSoftmax` with its gradient: (dropout(softmax(logits + mask bias)), softmax(…),
    each row's sum of the dropped weights).

    logits: `[B, N, T, S]` float32/bfloat16/float16; mask: bool `[B, T, S]` (False: NEG_INF
    added); rate: float32 scalar; seed: int32 `[2]`. The first two in logits' dtype, the sums
    float32 `[B, N, T]` (of the weights as rounded to that dtype; 1 without dropout). The dropped
    weights and their sums carry gradients; the scores (for attention plots) do not.
    """

    @tf.custom_gradient
    def _softmax(logits):
        dropped, scores, sums = kernels.fused_attention_softmax(logits, mask, rate, seed, mask_value=NEG_INF)

        def grad(d_dropped, d_scores=None, d_sums=None):
            with tf.name_scope("softmax_grad"):
                if d_sums is None:
                    d_sums = tf.zeros([0], tf.float32)
                return kernels.fused_attention_softmax_grad(d_dropped, scores, rate, seed, d_sums)

        return (dropped, tf.stop_gradient(scores), sums), grad

    with tf.name_scope("softmax"):
        return _softmax(logits)


def batch_matmul(kernels, x, y, adj_y: bool = False):
    """`x [..., M, K] · y [..., K, N]` (`adj_y`: `y [..., N, K]`, transposed), leading axes equal.

    kernels: None (`tf.matmul`) or the fused kernels' library: for float32 operands
    `SmallBatchMatMul` each way, the gradients by the same op (`small_product_kernels` says when it
    pays); other dtypes keep `tf.matmul` (oneDNN's bfloat16 products reach AMX).
    """
    if kernels is None or x.dtype != tf.float32:
        return tf.matmul(x, y, transpose_b=adj_y)

    @tf.custom_gradient
    def _product(x, y):
        def grad(dz):
            if adj_y:  # z = x·yᵀ: dx = dz·y, dy = dzᵀ·x
                return kernels.small_batch_mat_mul(dz, y), kernels.small_batch_mat_mul(dz, x, adj_x=True)
            return (kernels.small_batch_mat_mul(dz, y, adj_y=True),  # z = x·y: dx = dz·yᵀ, dy = xᵀ·dz
                    kernels.small_batch_mat_mul(x, dz, adj_x=True))

        return kernels.small_batch_mat_mul(x, y, adj_y=adj_y), grad

    return _product(x, y)


def rank3_mask(attention_mask) -> tf.Tensor:
    """A boolean attention mask with leading axes added up to rank 3 (`[S]` or `[T, S]` →
    `[1, 1, S]` / `[1, T, S]`), broadcastable to `[B, T, S]`."""
    mask = tf.cast(attention_mask, tf.bool)
    while mask.shape.rank < 3:
        mask = mask[tf.newaxis]
    return mask


@tf.custom_gradient
def _without_bias(projected, bias):
    """`projected` unchanged, with a zero gradient for `bias`: a bias whose true gradient is 0
    (the key bias, see `CachedMultiHeadAttention._project_training`), not added."""
    def grad(upstream):
        return upstream, tf.zeros_like(bias)
    return tf.identity(projected), grad


def dense_matrix(dense, dtype, inputs: int = 1) -> tuple:
    """A Dense or EinsumDense layer as a 2-D product: (kernel `[in, out]`, its first `inputs`
    axes flattened into `in` and the rest into `out`; bias `[out]`, zeros without one), in `dtype`."""
    kernel = tf.cast(dense.kernel, dtype)
    rows, columns = math.prod(kernel.shape[:inputs]), math.prod(kernel.shape[inputs:])
    bias = tf.reshape(tf.cast(dense.bias, dtype), [columns]) if dense.bias is not None else tf.zeros([columns], dtype)
    return tf.reshape(kernel, [rows, columns]), bias


def write_positions(cache, update, index, axis: int = 1):
    """`cache` with `update` written at positions `index … index+U-1` of its axis `axis`.

    cache: `[d0, …, d(axis-1), L, …]`; update: the same with U positions; index: int scalar,
    index + U ≤ L. One `tensor_scatter_nd_update` (static shapes, compiles under XLA): it
    writes U positions and copies the cache at most once, where a gather-and-select over the
    whole cache (and the slicing and re-stacking of keys and values around it) copied it
    about eight times per layer and step (5.5 → 1.5 ms per layer and step at batch 64 with a
    100-position cache, docs/speed.md "Decoding speed").
    """
    shape = tf.shape(update)
    leading = [tf.range(shape[i]) for i in range(axis)] + [index + tf.range(shape[axis])]
    grid = tf.meshgrid(*leading, indexing="ij")  # axis + 1 tensors of shape update.shape[:axis + 1]
    indices = tf.stack(grid, axis=-1)  # [d0, …, U, axis + 1]
    return tf.tensor_scatter_nd_update(cache, indices, tf.cast(update, cache.dtype))


@keras.saving.register_keras_serializable(package="transformer")
class FeedForward(keras.layers.Layer):
    """Position-wise FFN: Dense(dff, relu) → [Dropout(activation_dropout)] → Dense(d_model) → Dropout.

    `[B, T, d]` → same. `activation_dropout` (default 0: none) drops ReLU outputs.
    """

    def __init__(self, d_model: int, dff: int, dropout_rate: float, activation_dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.dff, self.dropout_rate = d_model, dff, dropout_rate
        self.activation_dropout = activation_dropout
        self.inner = keras.layers.Dense(dff, activation="relu", dtype=self.dtype_policy, name="inner")
        self.outer = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="outer")
        self.dropout = FastDropout(dropout_rate, dtype=self.dtype_policy)
        self.inner_dropout = (FastDropout(activation_dropout, dtype=self.dtype_policy)
                              if activation_dropout else None)

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.outer.build(tuple(input_shape[:-1]) + (self.dff,))
        super().build(input_shape)

    def call(self, x, training=None):
        kernels = active_kernels() if training else None
        # With the fused kernels (bfloat16 training), each dropout runs in its dense layer's bias kernel.
        fused = uses_kernels(x.dtype, kernels)
        inner_dropout = (dropout_rate_and_seed(self.inner_dropout)
                         if fused and self.inner_dropout is not None else None)
        hidden = affine(x, *dense_matrix(self.inner, self.compute_dtype), relu=True, kernels=kernels,
                        dropout=inner_dropout)
        if self.inner_dropout is not None and inner_dropout is None:
            hidden = self.inner_dropout(hidden, training=training)
        outer_dropout = dropout_rate_and_seed(self.dropout) if fused and self.dropout_rate > 0 else None
        y = affine(hidden, *dense_matrix(self.outer, self.compute_dtype), kernels=kernels, dropout=outer_dropout)
        return y if outer_dropout is not None else self.dropout(y, training=training)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "dff": self.dff, "dropout_rate": self.dropout_rate,
                "activation_dropout": self.activation_dropout}


def _attention(num_heads, key_dim, dropout_rate, dtype_policy, name):
    return CachedMultiHeadAttention(
        num_heads=num_heads, key_dim=key_dim, dropout=dropout_rate, dtype=dtype_policy, name=name
    )


class _Block(keras.layers.Layer):
    """What encoder and decoder blocks share: sizes, dropout rates and the norm position.

    Post-norm (Vaswani et al., the tutorial): x = LN(x + f(x)). Pre-norm (Nguyen & Salazar
    2019; needs a final LN on the stack's output, see `Transformer`): x = x + f(LN(x)).
    attention_dropout: dropout on attention probabilities (None: dropout_rate).
    activation_dropout: dropout on the FFN's ReLU outputs (default 0).
    """

    def __init__(self, d_model: int, num_heads: int, key_dim: int, dff: int, dropout_rate: float,
                 pre_norm: bool = False, attention_dropout=None, activation_dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.key_dim = d_model, num_heads, key_dim
        self.dff, self.dropout_rate, self.pre_norm = dff, dropout_rate, pre_norm
        self.attention_dropout, self.activation_dropout = attention_dropout, activation_dropout
        self._attention_rate = dropout_rate if attention_dropout is None else attention_dropout

    def _norm(self, name):
        return LayerNorm(dtype=self.dtype_policy, name=name)

    def _sublayer_input(self, norm, x):
        """What a sublayer reads: LN(x) with pre-norm, x with post-norm."""
        return norm(x) if self.pre_norm else x

    def _residual(self, norm, x, update):
        """x + update (pre-norm) or LN(x + update) (post-norm)."""
        return x + update if self.pre_norm else norm(x + update)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "key_dim": self.key_dim, "dff": self.dff, "dropout_rate": self.dropout_rate,
                "pre_norm": self.pre_norm, "attention_dropout": self.attention_dropout,
                "activation_dropout": self.activation_dropout}


@keras.saving.register_keras_serializable(package="transformer")
class EncoderLayer(_Block):
    """Encoder block: self-attention, FFN; post-norm LN(x + f(x)) or pre-norm x + f(LN(x)).

    Args: see `_Block`.

    Call arguments:
        x: `[batch, src_len, d_model]`.
        attention_mask: bool `[batch, 1, src_len]` (True at real source tokens).

    Returns:
        `[batch, src_len, d_model]`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attention = _attention(self.num_heads, self.key_dim, self._attention_rate, self.dtype_policy,
                                         "self_attention")
        self.attention_norm = self._norm("attention_norm")
        self.ffn = FeedForward(self.d_model, self.dff, self.dropout_rate, self.activation_dropout,
                               dtype=self.dtype_policy, name="ffn")
        self.ffn_norm = self._norm("ffn_norm")

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape)
        self.attention_norm.build(x_shape)
        self.ffn.build(x_shape)
        self.ffn_norm.build(x_shape)
        self.built = True

    def call(self, x, attention_mask=None, training=None):  # noqa: D102
        h = self._sublayer_input(self.attention_norm, x)
        x = self._residual(self.attention_norm, x,
                           self.self_attention(h, h, attention_mask=attention_mask, training=training))
        h = self._sublayer_input(self.ffn_norm, x)
        return self._residual(self.ffn_norm, x, self.ffn(h, training=training))


@keras.saving.register_keras_serializable(package="transformer")
class DecoderLayer(_Block):
    """Decoder block: causal self-attention, cross-attention, FFN; post- or pre-norm (`_Block`).

    Call arguments:
        x: `[batch, tgt_len, d_model]`.
        memory: `[batch, src_len, d_model]` encoder output (ignored when `cross_cache` given).
        self_attention_mask: bool `[batch, tgt_len, key_len]` (causal & padding).
        cross_attention_mask: bool `[batch, 1, src_len]`.
        self_cache: optional `[batch, 2, max_length, heads, key_dim]`, with
            `cache_update_index` (the position of `x`'s first token).
        cross_cache: optional `[batch, 2, src_len, heads, key_dim]` (see `cross_cache_for`).

    Returns:
        `(x [batch, tgt_len, d_model], cross_scores [batch, heads, tgt_len, src_len],
        self_cache or None)`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rate, policy = self._attention_rate, self.dtype_policy
        self.self_attention = _attention(self.num_heads, self.key_dim, rate, policy, "self_attention")
        self.self_attention_norm = self._norm("self_attention_norm")
        self.cross_attention = _attention(self.num_heads, self.key_dim, rate, policy, "cross_attention")
        self.cross_attention_norm = self._norm("cross_attention_norm")
        self.ffn = FeedForward(self.d_model, self.dff, self.dropout_rate, self.activation_dropout,
                               dtype=policy, name="ffn")
        self.ffn_norm = self._norm("ffn_norm")

    def build(self, x_shape, memory_shape=None):
        memory_shape = memory_shape or x_shape
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_norm.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        self.cross_attention_norm.build(x_shape)
        self.ffn.build(x_shape)
        self.ffn_norm.build(x_shape)
        self.built = True

    def call(self, x, memory, self_attention_mask=None, cross_attention_mask=None, self_cache=None,
             cross_cache=None, cache_update_index=None, training=None):
        h = self._sublayer_input(self.self_attention_norm, x)
        if self_cache is not None:
            attended, self_cache = self.self_attention(
                h, h, attention_mask=self_attention_mask, cache=self_cache,
                cache_update_index=cache_update_index, training=training)
        else:
            attended = self.self_attention(h, h, attention_mask=self_attention_mask, training=training)
        x = self._residual(self.self_attention_norm, x, attended)
        h = self._sublayer_input(self.cross_attention_norm, x)
        if cross_cache is not None:
            attended, cross_scores, _ = self.cross_attention(
                h, h, attention_mask=cross_attention_mask, cache=cross_cache, training=training,
                return_attention_scores=True)
        else:
            attended, cross_scores = self.cross_attention(
                h, memory, attention_mask=cross_attention_mask, training=training, return_attention_scores=True)
        x = self._residual(self.cross_attention_norm, x, attended)
        h = self._sublayer_input(self.ffn_norm, x)
        x = self._residual(self.ffn_norm, x, self.ffn(h, training=training))
        return x, cross_scores, self_cache

    def cross_cache_for(self, memory):
        """Precomputed cross-attention keys/values `[batch, 2, src_len, heads, key_dim]`."""
        return self.cross_attention.project_key_value(memory)
