"""Decoding strategies, kept apart from the model (OpenNMT-tf `utils/decoding.py` style).

A strategy drives a step callback and never reaches into the model:

    symbols_to_logits_fn(ids, step, state[, rows]) -> (logits, state) or (logits, state, attention)
        ids:       int32 `[batch]`, the tokens at position `step` (position 0 holds [START]).
        step:      int32 scalar.
        state:     nested structure of tensors with a leading batch dimension: the
                   per-hypothesis decoder state (the self-attention cache). Beam search
                   gathers it by beam parent every step.
        rows:      only when the strategy is given `rows=`: nested per-row constants with a
                   leading batch dimension (cross-attention keys/values, source bias); in
                   beam search one row per *sentence* (`[batch / beam_size, ...]`, untiled).
        logits:    float32 `[batch, vocab]`, the distribution of the token at `step + 1`.
        attention: optional `[batch, ...]` (e.g. cross-attention `[batch, heads, src_len]`).

Anything that is the same for every hypothesis of a sentence (encoder memory, source mask,
cross-attention keys/values) is *not* state: the callback closes over it or gets it as
`rows`, and it is never reordered by beam parent. Beam search hands `rows` over once per
sentence (the lean step attends with a sentence's hypotheses together); a callback that
closes over such constants needs them tiled `beam_size` times, once, before the loop.

Dropping finished rows (`drop_finished`, lean decoding only): a length-sorted batch still
runs every row until its longest output ends. When the rows (greedy) or sentences (beam)
still decoding are at most `drop_finished` of those computed, the loop keeps only them:
inputs, state and `rows` are gathered to the live rows, each remembers its row in the
full-size outputs. A row's result does not change (its arithmetic never depends on the other
rows); the callback then must close over nothing with a batch dimension.

`step_decoder_fn` builds the callback from `transformer.model.step_decoder.StepDecoder`
(the default: caches grown by one position per step, few ops; not for XLA) and
`model_step_fn` from the model's fixed-size cache API (`Transformer.encode`, `init_cache`,
`decode_step`; static shapes, for XLA); `greedy_translate` / `beam_translate` do the whole
thing for a batch of source ids. `uncached_greedy_decode` is the TF tutorial's Translator design (the
full model re-run on the whole prefix every step), kept as the speed baseline and as the
reference that cached decoding must reproduce token for token.

Generated ids live in a `[batch, max_steps]` buffer; with the fixed-size cache and no
dropping every shape is static inside the loops (XLA can compile them), a growing cache and
a shrinking batch are declared to the loop by its shape invariants. Generated ids never
include [START]; after [END] a row holds [PAD].

Size: over ~350 lines on purpose: greedy, beam search and the uncached reference loop share
the step-callback contract above; splitting them would separate a strategy from its reference.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence

import tensorflow as tf

from transformer.base.config import DecodeConfig
from transformer.base.constants import END_ID, PAD_ID, START_ID
from transformer.model.layers import NEG_INF
from transformer.model.step_decoder import StepDecoder

DEFAULT_FORBIDDEN_IDS = (PAD_ID, START_ID)  # never generated: PAD is masked as a key, START only opens
DROP_FINISHED = DecodeConfig.drop_finished


class GreedyResult(NamedTuple):
    """Output of `greedy_decode` / `greedy_translate`.

    ids: int32 `[batch, max_steps]` generated tokens ([END] included, [PAD] after it).
    lengths: int32 `[batch]`, generated tokens per row, [END] included.
    log_probs: float32 `[batch]`, sum of the chosen tokens' log-probabilities (None with
        `return_log_probs=False`).
    attention: `[batch, max_steps, ...]` per-step callback attention (zeros after [END]),
        or None unless `return_attention=True`.
    """

    ids: tf.Tensor
    lengths: tf.Tensor
    log_probs: Optional[tf.Tensor]
    attention: Optional[tf.Tensor] = None


class BeamResult(NamedTuple):
    """Output of `beam_search` / `beam_translate`; hypotheses best first.

    ids: int32 `[batch, beam_size, max_steps]` ([PAD] after [END]).
    scores: float32 `[batch, beam_size]`, log_probs / length_penalty(lengths), descending.
    log_probs: float32 `[batch, beam_size]`.
    lengths: int32 `[batch, beam_size]`, [END] included.
    """

    ids: tf.Tensor
    scores: tf.Tensor
    log_probs: tf.Tensor
    lengths: tf.Tensor


StepFn = Callable[..., tuple]


class _GreedyRows(NamedTuple):
    """Greedy's loop state per computed row, leading dimension b (the batch until finished rows
    are dropped): the token fed next int32 `[b]`, the row's place in the outputs int32 `[b]`,
    whether it has ended bool `[b]`, its length limit int32 `[b]`, the callback's state and
    per-row constants (`()` when none)."""

    inputs: tf.Tensor
    where: tf.Tensor
    finished: tf.Tensor
    limits: tf.Tensor
    state: object
    rows: object


class _BeamSentences(NamedTuple):
    """Beam search's loop state per sentence still searched, leading dimension b (K = beam size,
    T = max_steps): the tokens fed next int32 `[b, K]`, the sentence's place in the outputs
    int32 `[b]`, its hypotheses' ids int32 `[b, K, T]`, log-probabilities and scores float32
    `[b, K]`, finished bool `[b, K]`, lengths int32 `[b, K]`, whether the sentence has stopped
    bool `[b]`, its length limit int32 `[b, 1]` and the largest length penalty it can reach
    float32 `[b, 1]`."""

    inputs: tf.Tensor
    where: tf.Tensor
    ids: tf.Tensor
    log_probs: tf.Tensor
    scores: tf.Tensor
    finished: tf.Tensor
    lengths: tf.Tensor
    stopped: tf.Tensor
    limits: tf.Tensor
    max_penalty: tf.Tensor


class _BeamHypotheses(NamedTuple):
    """Beam search's per-hypothesis part: the callback's state (`[b * K, ...]`; by slot `[b, ...]`),
    the per-sentence constants `[b, ...]` (`()` when none) and, by slot, the lineage int32
    `[b, K, step]` (else `()`)."""

    state: object
    rows: object
    lineage: object


# ---- the model as a step callback -----------------------------------------------------
def model_step_fn(model, src_mask: tf.Tensor, cross_cache: list) -> StepFn:
    """`symbols_to_logits_fn` for a `transformer.model.transformer.Transformer`.

    Args:
        model: the Transformer (uses `decode_step` only).
        src_mask: bool `[batch, src_len]`, True at real source tokens.
        cross_cache: list (one per decoder layer), `model.init_cache(...)["cross"]`.
            Closed over: never reordered.

    Returns:
        `fn(ids [batch], step, self_cache) -> (logits [batch, vocab] float32, self_cache,
        cross_attention [batch, heads, src_len])`, where `self_cache` is the list of
        fixed-size self-attention caches, leading dimension batch (the state).
    """

    def symbols_to_logits(ids, step, self_cache):
        cache = {"self": self_cache, "cross": cross_cache}
        logits, cache, cross_scores = model.decode_step(ids[:, tf.newaxis], step, src_mask, cache)
        return logits[:, 0, :], cache["self"], cross_scores[:, :, 0, :]  # [B, V], ..., [B, heads, S]

    return symbols_to_logits


def _mask_forbidden(logits: tf.Tensor, forbidden_ids: Sequence[int]) -> tf.Tensor:
    """Sets the logits of `forbidden_ids` to NEG_INF. `[batch, vocab]` float32 → same."""
    if not forbidden_ids:
        return logits
    vocab = tf.shape(logits)[-1]
    forbidden = tf.reduce_any(tf.equal(tf.range(vocab)[:, tf.newaxis], tf.constant(list(forbidden_ids))), -1)
    return tf.where(forbidden[tf.newaxis, :], tf.cast(NEG_INF, logits.dtype), logits)


def _write_column(buffer: tf.Tensor, column: tf.Tensor, index) -> tf.Tensor:
    """`buffer[..., index] = column` for a fixed-size buffer `[..., T]` (static shapes)."""
    at = tf.equal(tf.range(tf.shape(buffer)[-1]), index)
    return tf.where(at, column[..., tf.newaxis], buffer)


def _batch_shapes(structure, free: bool = False):
    """`tf.while_loop` shape invariants: the static shape of each tensor of `structure`
    (unknown for a TensorArray), its leading (batch) dimension None when `free`."""

    def shape(x):
        if isinstance(x, tf.TensorArray):
            return tf.TensorShape(None)
        known = tf.convert_to_tensor(x).shape
        return tf.TensorShape([None]).concatenate(known[1:]) if free and known.rank else known

    return tf.nest.map_structure(shape, structure)


def _keep_live(live: tf.Tensor, fraction: float, take: Callable, structure):
    """`take(structure, keep)` with `keep` int32 `[n]` the positions where `live` (bool `[b]`)
    is True, when 0 < n ≤ fraction · b; else `structure` unchanged (one `tf.cond`)."""
    count = tf.reduce_sum(tf.cast(live, tf.int32))
    few = (count > 0) & (tf.cast(count, tf.float32) <= fraction * tf.cast(tf.size(live), tf.float32))
    return tf.cond(few, lambda: take(structure, tf.cast(tf.where(live)[:, 0], tf.int32)), lambda: structure)


def _gather_rows(structure, keep: tf.Tensor):
    """Every tensor of `structure` (`[b, ...]`) at rows `keep` (int32 `[n]`) → `[n, ...]`."""
    return tf.nest.map_structure(lambda x: tf.gather(x, keep), structure)


TOP_K_BLOCK = 128  # vocabulary entries per block of `_top_k`'s first stage


def _top_k(logits: tf.Tensor, k: int, block: int = TOP_K_BLOCK) -> tuple:
    """`tf.math.top_k(logits, k)` for float32 `[rows, vocab]` (same values, tokens and order, ties to
    the lower index), in two cheap stages: the maximum of each `block` entries, the `k` blocks
    with the largest maxima (every one of the k best entries lies in one of them: an entry in
    another block is outranked by those blocks' maxima), then top-k over those `k · block`
    entries, kept in vocabulary order. One pass over `[rows, vocab]` (a max) instead of a
    top-k scan; returns (values `[rows, k]`, int32 indices `[rows, k]`)."""
    vocab = logits.shape[-1]
    blocks = -(-vocab // block) if vocab is not None else 0
    if blocks <= k:  # nothing to prune (or an unknown vocabulary): one top-k
        return tf.math.top_k(logits, k=k)
    rows = tf.shape(logits)[0]
    padded = tf.pad(logits, [[0, 0], [0, blocks * block - vocab]], constant_values=float("-inf"))
    padded = tf.reshape(padded, [rows, blocks, block])  # [R, blocks, block]
    _, best_blocks = tf.math.top_k(tf.reduce_max(padded, axis=-1), k=k)  # [R, k]
    best_blocks = tf.sort(best_blocks, axis=-1)  # vocabulary order, so ties still go to the lower index
    candidates = tf.reshape(tf.gather(padded, best_blocks, batch_dims=1), [rows, k * block])  # [R, k·block]
    values, positions = tf.math.top_k(candidates, k=k)
    tokens = tf.gather(best_blocks, positions // block, batch_dims=1) * block + positions % block
    return values, tokens


def _beam_candidates(logits: tf.Tensor, k: int) -> tuple:
    """Each row's `k` best tokens and their log-probabilities, from float32 logits `[rows, vocab]`:
    (log_probs float32 `[rows, k]`, descending, tokens int32 `[rows, k]`).

    Equals `top_k(log_softmax(logits))` (same tokens and order; log-probabilities to rounding):
    the ranking runs on the logits (`_top_k`), and only the `k` chosen are normalised by the
    row's log-sum-exp, whose maximum is the first of them. Passes over `[rows, vocab]`: the
    top-k's, then one subtract, exp and sum, instead of log-softmax's materialised output and a
    top-k scan of it.
    """
    top_logits, tokens = _top_k(logits, k)  # [R, k]
    maximum = top_logits[:, :1]  # [R, 1]
    log_norm = tf.math.log(tf.reduce_sum(tf.exp(logits - maximum), axis=-1, keepdims=True))  # [R, 1]
    return (top_logits - maximum) - log_norm, tokens


def _call(fn: StepFn, ids, step, state, rows, lineage=None):
    """The step callback, with `rows` as 4th argument when the strategy was given any, and
    `lineage` as 5th when beam search keeps the state by slot."""
    if lineage is not None:
        return fn(ids, step, state, rows, lineage)
    return fn(ids, step, state) if rows is None else fn(ids, step, state, rows)


# ---- greedy ----------------------------------------------------------------------------
def greedy_decode(
    symbols_to_logits_fn: StepFn,
    start_ids: tf.Tensor,
    state,
    max_steps: int,
    *,
    end_id: int = END_ID,
    max_lengths: Optional[tf.Tensor] = None,
    forbidden_ids: Sequence[int] = DEFAULT_FORBIDDEN_IDS,
    return_attention: bool = False,
    state_shape_invariants=None,
    rows=None,
    drop_finished: float = 0.0,
    return_log_probs: bool = True,
) -> GreedyResult:
    """Batched greedy decoding in one `tf.while_loop`.

    Args:
        symbols_to_logits_fn: the step callback (see the module docstring).
        start_ids: int `[batch]`, the token at position 0 (normally [START]).
        state: the callback's initial state (e.g. the empty self-attention cache).
        max_steps: int (Python or scalar tensor). At most this many tokens are generated.
        end_id: int. A row is finished once it emits this token.
        max_lengths: optional int `[batch]`: row i is finished after `max_lengths[i]` tokens
            (bounds decoding by source length).
        forbidden_ids: token ids never generated. Defaults to [PAD], [START].
        return_attention: bool. Collect the callback's attention output every step.
        state_shape_invariants: `tf.while_loop` shape invariants of `state` when its shape
            changes between steps (a growing cache), else None.
        rows: optional per-row constants handed to the callback (module docstring).
        drop_finished: float in [0, 1). Drop finished rows once the unfinished ones are at most
            this fraction of the rows computed (module docstring); 0: never (static shapes).
        return_log_probs: bool. Sum the chosen tokens' log-probabilities (a log-softmax over
            `[batch, vocab]` every step); False: `GreedyResult.log_probs` is None.

    Returns:
        `GreedyResult`. The loop stops when every row is finished or after `max_steps`.

    Example:
        >>> fn = model_step_fn(model, src_mask, cache["cross"])
        >>> result = greedy_decode(fn, tf.fill([4], 2), cache["self"], 20)
        >>> result.ids.shape  # [4, 20]
    """
    start_ids = tf.cast(start_ids, tf.int32)
    batch = tf.shape(start_ids)[0]
    ids = tf.fill([batch, max_steps], tf.constant(PAD_ID, tf.int32))
    lengths = tf.zeros([batch], tf.int32)
    log_probs = tf.zeros([batch], tf.float32) if return_log_probs else ()  # (): an empty loop variable
    # An empty tuple is an empty loop variable when attention is not collected.
    attention = tf.TensorArray(tf.float32, size=0, dynamic_size=True) if return_attention else ()
    limits = tf.fill([batch], tf.cast(max_steps, tf.int32)) if max_lengths is None else tf.cast(max_lengths, tf.int32)
    computed = _GreedyRows(start_ids, tf.range(batch), tf.zeros([batch], tf.bool), limits, state,
                           () if rows is None else rows)

    def cond(step, computed, ids, lengths, log_probs, attention):
        return (step < max_steps) & tf.logical_not(tf.reduce_all(computed.finished))

    def body(step, computed, ids, lengths, log_probs, attention):
        where, finished = computed.where, computed.finished
        outputs = _call(symbols_to_logits_fn, computed.inputs, step, computed.state,
                        None if rows is None else computed.rows)
        logits, state = outputs[0], outputs[1]
        logits = _mask_forbidden(tf.cast(logits, tf.float32), forbidden_ids)  # [b, V]
        next_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [b]
        next_ids = tf.where(finished, PAD_ID, next_ids)
        at = where[:, tf.newaxis]  # [b, 1]: the rows' places in the outputs
        ids = tf.tensor_scatter_nd_update(ids, tf.stack([where, tf.fill(tf.shape(where), step)], 1), next_ids)
        if return_log_probs:
            chosen = tf.gather(tf.nn.log_softmax(logits), next_ids, batch_dims=1)  # [b]
            log_probs = tf.tensor_scatter_nd_add(log_probs, at, tf.where(finished, 0.0, chosen))
        lengths = tf.tensor_scatter_nd_add(lengths, at, tf.cast(tf.logical_not(finished), tf.int32))
        if return_attention:
            step_attention = tf.cast(outputs[2], tf.float32)  # [b, ...]
            keep = tf.reshape(tf.logical_not(finished), [-1] + [1] * (step_attention.shape.rank - 1))
            full = tf.concat([[batch], tf.shape(step_attention)[1:]], 0)
            attention = attention.write(step, tf.scatter_nd(at, tf.where(keep, step_attention, 0.0), full))
        finished = finished | tf.equal(next_ids, end_id) | (step + 1 >= computed.limits)
        computed = computed._replace(inputs=next_ids, finished=finished, state=state)
        if drop_finished > 0:
            computed = _keep_live(tf.logical_not(finished), drop_finished, _gather_rows, computed)
        return step + 1, computed, ids, lengths, log_probs, attention

    loop_vars = (tf.constant(0), computed, ids, lengths, log_probs, attention)
    free = drop_finished > 0
    invariants = None
    if free or state_shape_invariants is not None:
        computed_shapes = _batch_shapes(computed, free)
        if state_shape_invariants is not None:
            computed_shapes = computed_shapes._replace(state=state_shape_invariants)
        invariants = (tf.TensorShape([]), computed_shapes, *_batch_shapes(loop_vars[2:]))
    _, _, ids, lengths, log_probs, attention = tf.while_loop(
        cond, body, loop_vars, maximum_iterations=max_steps, shape_invariants=invariants)
    if not return_attention:
        attention = None
    else:
        stacked = attention.stack()  # [steps, B, ...]
        rank = stacked.shape.rank
        stacked = tf.transpose(stacked, [1, 0] + list(range(2, rank)))  # [B, steps, ...]
        pad = max_steps - tf.shape(stacked)[1]
        attention = tf.pad(stacked, [[0, 0], [0, pad]] + [[0, 0]] * (rank - 2))
    return GreedyResult(ids, lengths, log_probs if return_log_probs else None, attention)


# ---- beam search ---------------------------------------------------------------------
def length_penalty(lengths: tf.Tensor, alpha: float) -> tf.Tensor:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al. 2016), float32."""
    return tf.pow((5.0 + tf.cast(lengths, tf.float32)) / 6.0, alpha)


def tile_beams(x: tf.Tensor, beam_size: int) -> tf.Tensor:
    """`[batch, ...]` → `[batch * beam_size, ...]`, each row repeated beam_size times in place."""
    return tf.repeat(x, beam_size, axis=0)


def beam_search(
    symbols_to_logits_fn: StepFn,
    start_ids: tf.Tensor,
    state,
    beam_size: int,
    max_steps: int,
    *,
    alpha: float = 0.6,
    end_id: int = END_ID,
    max_lengths: Optional[tf.Tensor] = None,
    forbidden_ids: Sequence[int] = DEFAULT_FORBIDDEN_IDS,
    early_stop: bool = True,
    state_shape_invariants=None,
    rows=None,
    drop_finished: float = 0.0,
    by_slot: bool = False,
) -> BeamResult:
    """Beam search with the GNMT length penalty, in one `tf.while_loop`, batched over
    sentences × beams.

    Candidates are ranked by `log_prob / ((5 + length) / 6) ** alpha`. A finished hypothesis
    keeps its score: its only continuation is [END] with log-probability 0 and its length
    stops growing. Only each hypothesis's `beam_size` best tokens can be among its
    sentence's `beam_size` best candidates, so the ranking runs over `[batch, beam²]`
    candidates, not `[batch, beam · vocab]`.

    Stopping. Without `early_stop` a sentence is searched until all `beam_size` hypotheses
    are finished. With it (the default) a sentence stops as soon as its best finished
    hypothesis cannot be beaten: a live hypothesis's log-probability only falls and its
    penalty is at most `length_penalty(limit)` (limit: the row's `max_lengths`, else
    `max_steps`), so when `best finished score >= max live log_prob / length_penalty(limit)`
    (alpha >= 0) no live hypothesis can overtake it (the bound of tensor2tensor's beam
    search). The sentence is then frozen: its best hypothesis is final, the others keep
    whatever they had (possibly unfinished). The loop ends when every sentence has stopped
    or after `max_steps` tokens. A sentence's result never depends on the other sentences of
    the batch.

    Args:
        symbols_to_logits_fn: the step callback; it is called on `batch * beam_size` rows
            (row `b * beam_size + k` is hypothesis k of sentence b) and must close over
            inputs already tiled with `tile_beams`, or get them per sentence as `rows`.
        start_ids: int `[batch]`, the token at position 0.
        state: initial per-hypothesis state, leading dimension `batch * beam_size`. It is
            gathered by beam parent after every step.
        beam_size: int.
        max_steps: int. At most this many tokens per hypothesis.
        alpha: float >= 0. Length-penalty exponent; 0 ranks by raw log-probability.
            Defaults to 0.6.
        end_id, max_lengths ([batch]), forbidden_ids: as in `greedy_decode`.
        early_stop: bool. Stop a sentence once its best hypothesis is final (see above).
        state_shape_invariants: as in `greedy_decode`.
        rows: per-sentence constants (`[batch, ...]`, untiled), handed to the callback with the
            `beam_size` hypotheses of each sentence; never reordered by parent.
        drop_finished: as in `greedy_decode`, for sentences: a sentence that has stopped (or whose
            hypotheses have all ended) leaves with its `beam_size` rows.
        by_slot: the state is kept by beam slot, never gathered by parent: its leading
            dimension is `batch` (sentences), and the callback gets a 5th argument, the lineage
            int32 `[b, beam_size, step + 1]`: for each hypothesis, the slot whose state entry
            holds each of its positions (its own slot at `step`). `rows` must be given.

    Returns:
        `BeamResult`, hypotheses sorted best first.
    """
    start_ids = tf.cast(start_ids, tf.int32)
    batch = tf.shape(start_ids)[0]
    k = beam_size
    # Only beam 0 is alive at first, so the k beams do not start as k copies of one hypothesis.
    log_probs = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)], tf.float32), [batch, 1])
    limits = tf.fill([batch], tf.cast(max_steps, tf.int32)) if max_lengths is None else tf.cast(max_lengths, tf.int32)
    # The largest length penalty a hypothesis of each sentence can reach: [B, 1].
    max_penalty = length_penalty(tf.minimum(limits, max_steps), alpha)[:, tf.newaxis]
    sentences = _BeamSentences(
        inputs=tf.reshape(tile_beams(start_ids, k), [batch, k]), where=tf.range(batch),
        ids=tf.fill([batch, k, max_steps], tf.constant(PAD_ID, tf.int32)), log_probs=log_probs, scores=log_probs,
        finished=tf.zeros([batch, k], tf.bool), lengths=tf.zeros([batch, k], tf.int32),
        stopped=tf.zeros([batch], tf.bool), limits=limits[:, tf.newaxis], max_penalty=max_penalty)
    if by_slot and rows is None:
        raise ValueError("beam_search(by_slot=True) needs rows")
    hypotheses = _BeamHypotheses(state, () if rows is None else rows,
                                 tf.zeros([batch, k, 0], tf.int32) if by_slot else ())
    results = BeamResult(ids=tf.zeros_like(sentences.ids), scores=tf.zeros_like(sentences.scores),
                         log_probs=tf.zeros_like(sentences.log_probs),
                         lengths=tf.zeros_like(sentences.lengths))  # [B, ...], written back

    def write_back(results, sentences):
        """The results with the rows of `sentences` (all b of them) written at their places."""
        at = sentences.where[:, tf.newaxis]
        return BeamResult(*(tf.tensor_scatter_nd_update(getattr(results, name), at, getattr(sentences, name))
                            for name in BeamResult._fields))

    def drop(structure, keep):  # keep: int32 [n] sentences
        sentences, hypotheses, results = structure
        rows_kept = keep if by_slot else tf.reshape(keep[:, tf.newaxis] * k + tf.range(k), [-1])  # [n (* k)]
        hypotheses = _BeamHypotheses(_gather_rows(hypotheses.state, rows_kept), _gather_rows(hypotheses.rows, keep),
                                     _gather_rows(hypotheses.lineage, keep))
        return _gather_rows(sentences, keep), hypotheses, write_back(results, sentences)

    def searching(sentences):
        """bool `[b]`: the sentence has neither stopped nor ended all its hypotheses."""
        return tf.logical_not(sentences.stopped | tf.reduce_all(sentences.finished, axis=1))

    def cond(step, sentences, hypotheses, results):
        return (step < max_steps) & tf.reduce_any(searching(sentences))

    def body(step, sentences, hypotheses, results):
        ids, log_probs, scores, finished, lengths, stopped = (
            sentences.ids, sentences.log_probs, sentences.scores, sentences.finished, sentences.lengths,
            sentences.stopped)
        state, lineage = hypotheses.state, hypotheses.lineage
        b = tf.shape(sentences.inputs)[0]
        if by_slot:  # each slot's new position is its own
            lineage = tf.concat([lineage, tf.tile(tf.range(k)[tf.newaxis, :, tf.newaxis], [b, 1, 1])], axis=2)
        outputs = _call(symbols_to_logits_fn, tf.reshape(sentences.inputs, [-1]), step, state,
                        None if rows is None else hypotheses.rows, lineage if by_slot else None)
        logits, state = outputs[0], outputs[1]
        logits = _mask_forbidden(tf.cast(logits, tf.float32), forbidden_ids)  # [b*K, V]
        # Each hypothesis's K best continuations; a finished one has one: [END] at log-probability 0.
        top_log_probs, top_tokens = _beam_candidates(logits, k)  # [b*K, K]
        top_log_probs, top_tokens = tf.reshape(top_log_probs, [b, k, k]), tf.reshape(top_tokens, [b, k, k])
        end_only = tf.where(tf.equal(tf.range(k), 0), 0.0, NEG_INF)  # [K]
        top_log_probs = tf.where(finished[:, :, tf.newaxis], end_only, top_log_probs)
        top_tokens = tf.where(finished[:, :, tf.newaxis], end_id, top_tokens)
        total = log_probs[:, :, tf.newaxis] + top_log_probs  # [b, K, K]
        new_lengths = lengths + tf.cast(tf.logical_not(finished), tf.int32)  # [b, K]
        candidate_scores = total / length_penalty(new_lengths, alpha)[:, :, tf.newaxis]

        new_scores, flat = tf.math.top_k(tf.reshape(candidate_scores, [b, k * k]), k=k)  # [b, K]
        parents = flat // k
        tokens = tf.gather(tf.reshape(top_tokens, [b, k * k]), flat, batch_dims=1)
        keep = stopped[:, tf.newaxis]  # [b, 1]: stopped sentences stay as they are
        parents = tf.where(keep, tf.range(k)[tf.newaxis], parents)
        new_log_probs = tf.gather(tf.reshape(total, [b, k * k]), flat, batch_dims=1)
        was_finished = tf.gather(finished, parents, batch_dims=1)
        tokens = tf.where(was_finished | keep, PAD_ID, tokens)
        ids = _write_column(tf.gather(ids, parents, batch_dims=1), tokens, step)
        scores = tf.where(keep, scores, new_scores)
        log_probs = tf.where(keep, log_probs, new_log_probs)
        lengths = tf.where(keep, lengths, tf.gather(new_lengths, parents, batch_dims=1))
        finished = tf.where(keep, finished, was_finished | tf.equal(tokens, end_id)) | (step + 1 >= sentences.limits)
        if early_stop:
            best_finished = tf.reduce_max(tf.where(finished, scores, NEG_INF), axis=1)  # [b]
            best_alive = tf.reduce_max(tf.where(finished, NEG_INF, log_probs) / sentences.max_penalty, axis=1)
            stopped = stopped | (tf.reduce_any(finished, axis=1) & (best_finished >= best_alive))
        if by_slot:
            lineage = tf.gather(lineage, parents, batch_dims=1)  # [b, K, step + 1]
        else:
            rows_of_parents = tf.reshape(parents + tf.range(b)[:, tf.newaxis] * k, [-1])  # [b*K] rows
            state = _gather_rows(state, rows_of_parents)
        sentences = sentences._replace(inputs=tokens, ids=ids, log_probs=log_probs, scores=scores, finished=finished,
                                       lengths=lengths, stopped=stopped)
        structure = (sentences, hypotheses._replace(state=state, lineage=lineage), results)
        if drop_finished > 0:
            structure = _keep_live(searching(sentences), drop_finished, drop, structure)
        return (step + 1, *structure)

    loop_vars = (tf.constant(0), sentences, hypotheses, results)
    free = drop_finished > 0
    invariants = None
    if free or by_slot or state_shape_invariants is not None:
        lineage_shape = tf.TensorShape([None if free else start_ids.shape[0], k, None]) if by_slot else ()
        hypothesis_shapes = _BeamHypotheses(state_shape_invariants or _batch_shapes(state, free),
                                            _batch_shapes(hypotheses.rows, free), lineage_shape)
        invariants = (tf.TensorShape([]), _batch_shapes(sentences, free), hypothesis_shapes, _batch_shapes(results))
    _, sentences, _, results = tf.while_loop(cond, body, loop_vars, maximum_iterations=max_steps,
                                             shape_invariants=invariants)
    return write_back(results, sentences)


# ---- whole-model helpers -------------------------------------------------------------
def cache_length(model, max_steps) -> tf.Tensor:
    """Self-attention cache positions needed for `max_steps` generated tokens (≤ max_length)."""
    return tf.minimum(max_steps, model.config.max_length)


def step_decoder_fn(decoder: StepDecoder, context: dict, group: int = 1) -> StepFn:
    """`symbols_to_logits_fn(ids, step, cache, rows)` for a `transformer.model.step_decoder.StepDecoder`:
    the state is its growing cache (per layer (keys, values) `[batch, heads, step, key_dim]`),
    `rows` the per-row part of `context` (`ROW_CONTEXT`: cross-attention keys/values, source
    bias; one row per `group` ids: per sentence in beam search, `group` = beam size), the rest
    of `context` (from `decoder.start`) is closed over."""
    shared = {key: value for key, value in context.items() if key not in ROW_CONTEXT}

    def symbols_to_logits(ids, step, cache, rows, lineage=None):
        return decoder.step({**shared, **rows}, ids, step, cache, group, lineage)  # [B, V] float32, cache, [B, heads, S]

    return symbols_to_logits


ROW_CONTEXT = ("cross", "bias")  # the parts of `StepDecoder.start`'s context with a batch dimension


def _start(model, src_ids, max_steps, beam_size: int, lean: bool, projection_dtype: str = "float32",
           forbidden_ids: Sequence[int] = ()):
    """Encoder once, then (step callback, initial state, per-row constants or None, state shape
    invariants) for `beam_size` hypotheses per row. The lean step writes `forbidden_ids` into
    its projection's bias (the strategy then need not mask them). The lean step's state with beam_size > 1
    is `slot_cache` (kept by beam slot: beam search runs `by_slot`) and its per-row constants
    stay one per sentence; the fixed-size cache path's state, cross-attention cache and mask
    are tiled. `projection_dtype`: the lean step's
    output projection (`StepDecoder`); the fixed-size cache path projects in float32 only
    ("auto" is float32 there)."""
    if not lean and projection_dtype == "bfloat16":
        raise ValueError(f"projection_dtype {projection_dtype} needs the lean step (lean=True)")
    memory, src_mask = model.encode(src_ids, training=False)
    tile = (lambda x: tile_beams(x, beam_size)) if beam_size > 1 else (lambda x: x)
    if lean:
        decoder = StepDecoder(model, projection_dtype, forbidden_ids)
        context, cache = decoder.start(memory, src_mask)
        rows = {key: context[key] for key in ROW_CONTEXT}
        if beam_size > 1:
            cache = decoder.slot_cache(tf.shape(src_ids)[0], beam_size)
        return step_decoder_fn(decoder, context, beam_size), cache, rows, decoder.cache_shape_invariants(cache)
    cache = model.init_cache(memory, src_mask, cache_length(model, max_steps))
    tiled = {}  # layers may share one cross cache tensor (the memory itself): tile it once
    cross = [tiled.setdefault(id(c), tile(c)) for c in cache["cross"]]  # [B*K, ...]
    return model_step_fn(model, tile(src_mask), cross), [tile(c) for c in cache["self"]], None, None


def greedy_translate(model, src_ids: tf.Tensor, max_steps, *, max_lengths=None, return_attention: bool = False,
                     forbidden_ids: Sequence[int] = DEFAULT_FORBIDDEN_IDS, lean: bool = True,
                     drop_finished: float = DROP_FINISHED, projection_dtype: str = "float32",
                     return_log_probs: bool = True) -> GreedyResult:
    """Cached greedy decoding of `src_ids [batch, src_len]` (pad 0): encoder once, one token per step.

    `max_steps` must be ≤ `model.config.max_length` (positions 0 … max_steps-1 are fed).
    With `return_attention`, `attention` is the last decoder layer's cross-attention
    `[batch, max_steps, heads, src_len]`. `lean` (default): the steps of
    `transformer.model.step_decoder.StepDecoder` (growing caches, finished rows dropped as
    `drop_finished` says; not for XLA); False: the model's `decode_step` with its fixed-size
    cache and every row to the end (static shapes, for XLA). `projection_dtype` (lean only):
    the output projection's matmul, "float32" or "bfloat16" (`StepDecoder`). `return_log_probs`:
    as in `greedy_decode` (the Translator needs only ids and lengths).
    """
    step_fn, state, rows, invariants = _start(model, src_ids, max_steps, 1, lean, projection_dtype, forbidden_ids)
    start = tf.fill([tf.shape(src_ids)[0]], tf.constant(START_ID, tf.int32))
    return greedy_decode(step_fn, start, state, max_steps, max_lengths=max_lengths,
                         forbidden_ids=() if lean else forbidden_ids,  # the lean step masks them
                         return_attention=return_attention, state_shape_invariants=invariants, rows=rows,
                         drop_finished=drop_finished if lean else 0.0, return_log_probs=return_log_probs)


def beam_translate(model, src_ids: tf.Tensor, beam_size: int, max_steps, *, alpha: float = 0.6,
                   max_lengths=None, forbidden_ids: Sequence[int] = DEFAULT_FORBIDDEN_IDS,
                   lean: bool = True, drop_finished: float = DROP_FINISHED,
                   projection_dtype: str = "float32") -> BeamResult:
    """Beam search for `src_ids [batch, src_len]`; `lean`, `drop_finished`, `projection_dtype` as in
    `greedy_translate`.

    The encoder runs once on `batch` rows. The cross-attention keys/values and the source mask
    are never reordered: the lean step keeps them per sentence (a sentence's hypotheses attend
    together), the fixed-size cache path tiles them `beam_size` times here, once. Only the
    self-attention cache (the state) follows the beam parents: the fixed-size cache is gathered
    by parent every step, the lean step's is kept by slot and masked by lineage (`by_slot`).
    """
    step_fn, state, rows, invariants = _start(model, src_ids, max_steps, beam_size, lean, projection_dtype,
                                              forbidden_ids)
    start = tf.fill([tf.shape(src_ids)[0]], tf.constant(START_ID, tf.int32))
    return beam_search(step_fn, start, state, beam_size, max_steps, alpha=alpha, max_lengths=max_lengths,
                       forbidden_ids=() if lean else forbidden_ids,  # the lean step masks them
                       state_shape_invariants=invariants, rows=rows,
                       drop_finished=drop_finished if lean else 0.0, by_slot=lean and beam_size > 1)


def uncached_greedy_decode(model, src_ids: tf.Tensor, max_steps, *, end_id: int = END_ID,
                           forbidden_ids: Sequence[int] = DEFAULT_FORBIDDEN_IDS) -> tf.Tensor:
    """The TF tutorial Translator's loop: no cache, the full model re-run on the whole prefix.

    Every step runs the encoder *and* the decoder over all tokens so far and keeps only the
    last position's logits; the output grows by one column per step. Meant for batch 1 (the
    tutorial's use), where it stops at [END]; with a larger batch it stops when every row
    has ended. Baseline for `scripts/benchmark_decoding.py` and the reference for the
    cached == uncached test.

    Returns:
        int32 `[batch, steps]` generated ids ([END] included, [PAD] after it), steps ≤ max_steps.
    """
    batch = tf.shape(src_ids)[0]
    output = tf.fill([batch, 1], tf.constant(START_ID, tf.int32))
    finished = tf.zeros([batch], tf.bool)

    def cond(step, output, finished):
        return (step < max_steps) & tf.logical_not(tf.reduce_all(finished))

    def body(step, output, finished):
        logits = model((src_ids, output), training=False)[:, -1, :]  # [B, V]
        next_ids = tf.argmax(_mask_forbidden(logits, forbidden_ids), axis=-1, output_type=tf.int32)
        next_ids = tf.where(finished, PAD_ID, next_ids)
        output = tf.concat([output, next_ids[:, tf.newaxis]], axis=1)
        return step + 1, output, finished | tf.equal(next_ids, end_id)

    _, output, _ = tf.while_loop(
        cond, body, (tf.constant(0), output, finished),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, None]), tf.TensorShape([None])),
        maximum_iterations=max_steps)
    return output[:, 1:]
