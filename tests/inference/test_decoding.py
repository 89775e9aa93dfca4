"""Decoding strategies (transformer/inference/decoding.py) on tiny random models and scripted callbacks."""

import math

import numpy as np
import pytest
import tensorflow as tf
from helpers_translation import tiny_model

from transformer.base.constants import END_ID, PAD_ID, START_ID
from transformer.inference import decoding
from transformer.model.step_decoder import StepDecoder

MAX_STEPS = 20
SRC_SPEC = [tf.TensorSpec([None, None], tf.int32)]  # one trace for every source shape


def graph(fn, **kwargs):
    """`fn` as a tf.function traced without AutoGraph, as the Translator and the export trace the
    decoding code (its loops are `tf.while_loop`s written out)."""
    return tf.function(fn, autograph=False, **kwargs)


def padded_sources():
    """Three source rows of different lengths ([START] … [END]), padded with 0: `[3, 8]`."""
    rows = [[START_ID, 5, 6, 7, 9, END_ID], [START_ID, 11, END_ID], [START_ID, 4, 8, 10, 12, 13, 14, END_ID]]
    width = max(map(len, rows))
    return rows, tf.constant([r + [PAD_ID] * (width - len(r)) for r in rows], tf.int32)


def by_drop_fraction(decode, fractions) -> dict:
    """{fraction: graph-mode `decode(src, max_lengths, drop_finished=fraction)`} for `padded_sources`
    rows and int32 `[batch]` limits."""
    spec = SRC_SPEC + [tf.TensorSpec([None], tf.int32)]
    return {fraction: graph(lambda s, n, fraction=fraction: decode(s, n, drop_finished=fraction),
                                  input_signature=spec) for fraction in fractions}


def pad_to(ids: np.ndarray, width: int) -> np.ndarray:
    return np.pad(ids, [(0, 0), (0, width - ids.shape[1])])


@pytest.mark.parametrize("lean", [True, False])  # growing caches / the model's fixed-size cache
@pytest.mark.parametrize("seed, head_width", [(0, "tutorial"), (1, "tutorial"), (2, "paper")])
def test_cached_batched_greedy_equals_uncached_batch_one_greedy(seed, head_width, lean):
    model = tiny_model(seed=seed, head_width=head_width)  # input cache / key-value cache
    rows, src = padded_sources()
    cached = graph(lambda s: decoding.greedy_translate(model, s, MAX_STEPS, lean=lean))(src)
    uncached_fn = graph(lambda s: decoding.uncached_greedy_decode(model, s, MAX_STEPS), input_signature=SRC_SPEC)
    for i, row in enumerate(rows):
        reference = uncached_fn(tf.constant([row], tf.int32)).numpy()  # the tutorial's loop, batch 1
        np.testing.assert_array_equal(cached.ids.numpy()[i], pad_to(reference, MAX_STEPS)[0], err_msg=f"row {i}")
        ended = np.flatnonzero(reference[0] == END_ID)
        expected_length = ended[0] + 1 if ended.size else MAX_STEPS
        assert cached.lengths.numpy()[i] == expected_length


def test_greedy_and_uncached_stop_at_end():
    model = tiny_model()
    model.final_layer.bias.assign(tf.one_hot(END_ID, model.config.tgt_vocab_size) * 100.0)  # END always wins
    _, src = padded_sources()
    cached = decoding.greedy_translate(model, src, MAX_STEPS)
    np.testing.assert_array_equal(cached.ids.numpy()[:, 0], [END_ID] * 3)
    np.testing.assert_array_equal(cached.ids.numpy()[:, 1:], 0)
    np.testing.assert_array_equal(cached.lengths.numpy(), [1, 1, 1])
    assert decoding.uncached_greedy_decode(model, src[:1], MAX_STEPS).numpy().tolist() == [[END_ID]]


def scripted_step_fn(end_steps, vocab=6, token=4):
    """Row b emits `token` until step `end_steps[b]`, then [END]; counts its calls."""
    end_steps = tf.constant(end_steps, tf.int32)
    calls = []

    def fn(ids, step, state):
        calls.append(1)
        target = tf.where(step >= end_steps, END_ID, token)
        return tf.one_hot(target, vocab) * 10.0, state + 1, tf.one_hot(target, vocab)

    return fn, calls


def test_greedy_stops_when_every_row_has_ended():
    fn, calls = scripted_step_fn([1, 3])
    result = decoding.greedy_decode(fn, tf.fill([2], START_ID), tf.zeros([2]), 10, return_attention=True)
    assert len(calls) == 4  # steps 0..3; eager while_loop runs the body in Python
    assert result.ids.numpy().tolist() == [[4, END_ID] + [0] * 8, [4, 4, 4, END_ID] + [0] * 6]
    assert result.lengths.numpy().tolist() == [2, 4]
    np.testing.assert_allclose(result.log_probs.numpy(), 0.0, atol=1e-3)
    assert result.attention.shape == (2, 10, 6)
    np.testing.assert_array_equal(result.attention.numpy()[0, 2:], 0.0)  # zeros after [END]


def test_greedy_stops_at_max_steps_and_row_limits():
    fn, calls = scripted_step_fn([50, 50])
    result = decoding.greedy_decode(fn, tf.fill([2], START_ID), tf.zeros([2]), 5)
    assert len(calls) == 5
    assert result.lengths.numpy().tolist() == [5, 5]
    assert END_ID not in result.ids.numpy()
    fn, calls = scripted_step_fn([50, 50])
    result = decoding.greedy_decode(fn, tf.fill([2], START_ID), tf.zeros([2]), 5, max_lengths=tf.constant([2, 3]))
    assert len(calls) == 3
    assert result.ids.numpy().tolist() == [[4, 4, 0, 0, 0], [4, 4, 4, 0, 0]]


def rows_step_fn(vocab=6, token=4):
    """Row b emits `token` until step `rows[b]` (its per-row constant), then [END]; records the
    rows of each call."""
    sizes = []

    def fn(ids, step, state, rows):
        sizes.append(int(tf.shape(ids)[0]))
        target = tf.where(step >= rows, END_ID, token)
        return tf.one_hot(target, vocab) * 10.0, state + 1, tf.one_hot(target, vocab) * tf.cast(rows[:, None], tf.float32)

    return fn, sizes


def test_dropping_finished_rows_shrinks_the_batch_and_keeps_every_row():
    end_steps = tf.constant([1, 3, 3, 9, 5])
    runs = {}
    for fraction in (0.0, 0.75):
        fn, sizes = rows_step_fn()
        runs[fraction] = decoding.greedy_decode(fn, tf.fill([5], START_ID), tf.zeros([5]), 12, rows=end_steps,
                                                return_attention=True, drop_finished=fraction), sizes
    (kept, kept_sizes), (dropped, dropped_sizes) = runs[0.0], runs[0.75]
    assert kept_sizes == [5] * 10
    # after step 1 row 0 has ended (4/5 live: kept), after step 3 rows 1, 2 (2/5: dropped),
    # after step 5 row 4 (1/2: dropped)
    assert dropped_sizes == [5, 5, 5, 5, 2, 2, 1, 1, 1, 1]
    assert dropped.ids.numpy().tolist() == kept.ids.numpy().tolist()
    assert dropped.ids.numpy()[3].tolist() == [4] * 9 + [END_ID, 0, 0]
    assert dropped.lengths.numpy().tolist() == [2, 4, 4, 10, 6]
    np.testing.assert_array_equal(dropped.log_probs.numpy(), kept.log_probs.numpy())
    np.testing.assert_array_equal(dropped.attention.numpy(), kept.attention.numpy())
    assert dropped.attention.numpy()[3, 9, END_ID] == 9 and dropped.attention.numpy()[4, 6:].max() == 0


def test_without_log_probs_the_same_ids_and_lengths():
    """`return_log_probs=False` (the Translator's greedy loop) skips the per-step log-softmax only."""
    end_steps = tf.constant([1, 3, 3, 9, 5])
    results = [decoding.greedy_decode(rows_step_fn()[0], tf.fill([5], START_ID), tf.zeros([5]), 12, rows=end_steps,
                                      drop_finished=0.75, return_log_probs=flag) for flag in (True, False)]
    assert results[1].log_probs is None and results[0].log_probs.shape == [5]
    assert results[1].ids.numpy().tolist() == results[0].ids.numpy().tolist()
    assert results[1].lengths.numpy().tolist() == results[0].lengths.numpy().tolist() == [2, 4, 4, 10, 6]


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_rows_of_very_different_lengths_get_their_single_row_results(head_width):
    """Rows ending at steps 1 … 20 in one batch (dropped as they end, in graph mode) give each
    row exactly what it gets decoded alone, and what it gets with no row ever dropped."""
    model = tiny_model(seed=8, head_width=head_width)
    rows, src = padded_sources()
    rows, src = rows * 2, tf.concat([src, src], 0)
    limits = tf.constant([1, 20, 3, 12, 6, 2])
    run = by_drop_fraction(lambda s, n, drop_finished: decoding.greedy_translate(
        model, s, MAX_STEPS, max_lengths=n, drop_finished=drop_finished), (0.0, 0.75, 0.95))
    kept = run[0.0](src, limits)
    for fraction in (0.75, 0.95):
        batch = run[fraction](src, limits)
        np.testing.assert_array_equal(batch.ids.numpy(), kept.ids.numpy())
        np.testing.assert_array_equal(batch.lengths.numpy(), kept.lengths.numpy())
        np.testing.assert_allclose(batch.log_probs.numpy(), kept.log_probs.numpy(), rtol=1e-6, atol=1e-6)
    lengths = kept.lengths.numpy()
    assert lengths.min() <= 2 and lengths.max() == MAX_STEPS  # rows end 1 … 20 steps apart
    for i, row in enumerate(rows):
        alone = run[0.75](tf.constant([row], tf.int32), limits[i:i + 1])
        np.testing.assert_array_equal(alone.ids.numpy()[0], batch.ids.numpy()[i], err_msg=f"row {i}")
        assert alone.lengths.numpy()[0] == batch.lengths.numpy()[i]
        np.testing.assert_allclose(alone.log_probs.numpy()[0], batch.log_probs.numpy()[i], rtol=1e-5, atol=1e-5)


def test_forbidden_ids_are_never_generated():
    def fn(ids, step, state):  # PAD then START are the most likely tokens
        return tf.tile(tf.constant([[9.0, 1.0, 8.0, 0.0, 2.0]]), [tf.shape(ids)[0], 1]), state

    result = decoding.greedy_decode(fn, tf.fill([1], START_ID), tf.zeros([1]), 3)
    assert result.ids.numpy().tolist() == [[4, 4, 4]]


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_beam_size_one_equals_greedy(head_width, lean):
    model = tiny_model(seed=3, head_width=head_width)
    _, src = padded_sources()
    greedy = decoding.greedy_translate(model, src, MAX_STEPS, lean=lean)
    beam = graph(lambda s: decoding.beam_translate(model, s, 1, MAX_STEPS, lean=lean))(src)
    np.testing.assert_array_equal(beam.ids.numpy()[:, 0], greedy.ids.numpy())
    np.testing.assert_array_equal(beam.lengths.numpy()[:, 0], greedy.lengths.numpy())
    np.testing.assert_allclose(beam.log_probs.numpy()[:, 0], greedy.log_probs.numpy(), rtol=1e-5, atol=1e-5)


def test_beam_hypotheses_sorted_by_penalised_score_and_batch_independent():
    model = tiny_model(seed=4)
    rows, src = padded_sources()
    search = graph(lambda s: decoding.beam_translate(model, s, 4, MAX_STEPS, alpha=0.6), input_signature=SRC_SPEC)
    result = search(src)
    scores = result.scores.numpy()
    assert np.all(np.diff(scores, axis=1) <= 1e-6), scores
    expected = result.log_probs.numpy() / ((5.0 + result.lengths.numpy()) / 6.0) ** 0.6
    np.testing.assert_allclose(scores, expected, rtol=1e-5)
    for i in range(len(rows)):  # tiling/gathering by parent never mixes sentences of a batch
        hypotheses = result.ids.numpy()[i].tolist()
        assert len({tuple(h) for h in hypotheses}) == 4, "beams must be distinct hypotheses"
        alone = search(tf.constant([rows[i]], tf.int32))
        np.testing.assert_array_equal(alone.ids.numpy()[0], result.ids.numpy()[i])
        np.testing.assert_allclose(alone.scores.numpy()[0], scores[i], rtol=1e-4, atol=1e-5)


def test_beam_candidates_equal_top_k_of_log_softmax():
    """Ranking the raw logits and normalising only the k chosen gives top_k(log_softmax):
    the same tokens in the same order (ties included) and the same log-probabilities."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, size=(6, 1000)).astype(np.float32)  # 8 blocks of decoding.TOP_K_BLOCK
    logits[1, [7, 9, 900]] = logits[1].max() + 1.0  # a three-way tie for first place, across blocks
    logits[2, :] = 0.5  # all equal
    logits[3, 10:] = decoding.NEG_INF  # forbidden-masked entries
    logits[4] *= 30.0  # a peaked row
    logits = decoding._mask_forbidden(tf.constant(logits), decoding.DEFAULT_FORBIDDEN_IDS)
    expected_log_probs, expected_tokens = tf.math.top_k(tf.nn.log_softmax(logits), k=4)
    log_probs, tokens = decoding._beam_candidates(logits, 4)
    np.testing.assert_array_equal(tokens.numpy(), expected_tokens.numpy())
    allowed = [i for i in range(10) if i not in decoding.DEFAULT_FORBIDDEN_IDS]
    assert tokens.numpy()[1, :3].tolist() == [7, 9, 900] and tokens.numpy()[2].tolist() == allowed[:4]
    np.testing.assert_allclose(log_probs.numpy(), expected_log_probs.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("vocab", [5, 130, 1000, 6388])  # one block … many, the last one partly filled
def test_blocked_top_k_equals_top_k_with_ties(vocab):
    """The two-stage top-k gives tf.math.top_k's values and indices, ties included (few distinct
    values, so many ties inside and across blocks, and -inf entries)."""
    rng = np.random.default_rng(vocab)
    logits = rng.integers(0, 6, size=(40, vocab)).astype(np.float32)
    logits[::7, vocab // 2:] = -np.inf
    logits[3] = 1.0
    for k in (1, 4):
        values, tokens = decoding._top_k(tf.constant(logits), k, block=16)
        expected_values, expected_tokens = tf.math.top_k(logits, k=k)
        np.testing.assert_array_equal(tokens.numpy(), expected_tokens.numpy())
        np.testing.assert_array_equal(values.numpy(), expected_values.numpy())


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_lean_beam_with_untiled_source_equals_fixed_cache_beam(head_width):
    """The lean beam search (cross-attention keys/values and source bias once per sentence, a
    sentence's hypotheses attending together) finds the hypotheses of the fixed-size-cache
    search, which tiles the source per hypothesis."""
    model = tiny_model(seed=4, head_width=head_width)
    _, src = padded_sources()
    limits = tf.constant([12, 6, 20])
    searches = [graph(lambda s, lean=lean: decoding.beam_translate(
        model, s, 4, MAX_STEPS, alpha=0.6, max_lengths=limits, lean=lean)) for lean in (True, False)]
    for seed in (4, 12):  # the traced searches read the model's variables: new weights, no new trace
        model.set_weights(tiny_model(seed=seed, head_width=head_width).get_weights())
        lean, fixed = (search(src) for search in searches)
        np.testing.assert_array_equal(lean.ids.numpy(), fixed.ids.numpy())
        np.testing.assert_array_equal(lean.lengths.numpy(), fixed.lengths.numpy())
        np.testing.assert_allclose(lean.scores.numpy(), fixed.scores.numpy(), rtol=1e-5, atol=1e-5)


def step_dependent_fn(vocab=5):
    """Token probabilities by position, whatever the prefix:
    step 0: [END] .4, a .6; step 1: a .5, [END] .5; step ≥ 2: [END] ≈ 1.
    Best by raw log-prob: "[END]" (ln .4 = -0.92) over "a [END]" and "a a [END]" (-1.20);
    with alpha = 1 the length penalty makes "a a [END]" best (-1.20 / (8/6) = -0.90)."""
    a = 4
    table = np.full((3, vocab), 1e-9)
    table[0, [END_ID, a]] = [0.4, 0.6]
    table[1, [END_ID, a]] = [0.5, 0.5]
    table[2, END_ID] = 1.0
    log_table = tf.constant(np.log(table), tf.float32)

    def fn(ids, step, state):
        logits = tf.gather(log_table, tf.minimum(step, 2))
        return tf.tile(logits[tf.newaxis], [tf.shape(ids)[0], 1]), state

    return fn


def test_length_penalty_changes_the_best_hypothesis():
    fn = step_dependent_fn()
    start, state = tf.fill([1], START_ID), tf.zeros([3])
    raw = decoding.beam_search(fn, start, state, beam_size=3, max_steps=6, alpha=0.0)
    penalised = decoding.beam_search(fn, start, state, beam_size=3, max_steps=6, alpha=1.0)
    assert raw.ids.numpy()[0, 0, :3].tolist() == [END_ID, 0, 0]
    assert penalised.ids.numpy()[0, 0, :3].tolist() == [4, 4, END_ID]
    np.testing.assert_allclose(raw.scores.numpy()[0, 0], math.log(0.4), rtol=1e-5)
    np.testing.assert_allclose(penalised.scores.numpy()[0, 0], math.log(0.3) / (8 / 6), rtol=1e-5)
    assert penalised.lengths.numpy()[0, 0] == 3


def test_beam_search_stops_at_max_steps():
    fn = step_dependent_fn()
    result = decoding.beam_search(fn, tf.fill([2], START_ID), tf.zeros([4]), beam_size=2, max_steps=1, alpha=0.0)
    assert result.ids.shape == (2, 2, 1)
    assert result.ids.numpy()[:, :, 0].tolist() == [[4, END_ID]] * 2  # "a" (.6) ranks above [END] (.4)
    assert result.lengths.numpy().tolist() == [[1, 1]] * 2


def test_greedy_compiles_with_xla_and_matches_graph_mode():
    """The fixed-size cache compiles under XLA and gives the lean (growing-cache) loop's ids."""
    model = tiny_model(seed=5)
    _, src = padded_sources()
    lean = graph(lambda s: decoding.greedy_translate(model, s, MAX_STEPS))(src)
    xla = graph(lambda s: decoding.greedy_translate(model, s, MAX_STEPS, lean=False), jit_compile=True)(src)
    np.testing.assert_array_equal(xla.ids.numpy(), lean.ids.numpy())
    np.testing.assert_allclose(xla.log_probs.numpy(), lean.log_probs.numpy(), rtol=1e-4, atol=1e-4)


def test_early_stopping_keeps_the_best_hypothesis_and_stops_sooner():
    """Stopping a sentence once its best finished hypothesis cannot be overtaken gives the
    same best hypothesis (or a better-scored one) as searching until every beam has ended,
    in no more steps; the result of each sentence is independent of the batch."""
    calls = {"early": 0, "full": 0}
    for seed in (4, 6):
        model = tiny_model(seed=seed)
        rows, src = padded_sources()
        limits = tf.constant([12, 6, 20])
        results = {}
        for mode in ("early", "full"):
            counter = []
            memory, src_mask = model.encode(src)
            cache = model.init_cache(memory, src_mask, MAX_STEPS)
            cross = [decoding.tile_beams(c, 4) for c in cache["cross"]]
            step_fn = decoding.model_step_fn(model, decoding.tile_beams(src_mask, 4), cross)

            def counted(ids, step, state, step_fn=step_fn, counter=counter):
                counter.append(1)
                return step_fn(ids, step, state)

            results[mode] = decoding.beam_search(
                counted, tf.fill([3], START_ID), [decoding.tile_beams(c, 4) for c in cache["self"]], 4, MAX_STEPS,
                alpha=0.6, max_lengths=limits, early_stop=mode == "early")
            calls[mode] += len(counter)
        early, full = results["early"], results["full"]
        assert np.all(early.scores.numpy()[:, 0] >= full.scores.numpy()[:, 0] - 1e-5)
        same = (early.ids.numpy()[:, 0] == full.ids.numpy()[:, 0]).all(axis=1)
        assert same.sum() >= 2, (early.ids.numpy()[:, 0], full.ids.numpy()[:, 0])
        assert (early.lengths.numpy()[:, 0] <= limits.numpy()).all()
    assert calls["early"] <= calls["full"]


def test_beam_hypotheses_are_well_formed_and_within_their_limits():
    """Every hypothesis: 1 <= length <= its sentence's limit, [END] at most once and only as
    its last token, [PAD] after its length; the best one is finished ([END]) or at the limit."""
    model = tiny_model(seed=7)
    _, src = padded_sources()
    limits = np.array([3, 9, 20])
    result = decoding.beam_translate(model, src, 3, MAX_STEPS, alpha=0.6, max_lengths=tf.constant(limits))
    ids, lengths = result.ids.numpy(), result.lengths.numpy()
    for b in range(3):
        for k in range(3):
            n = lengths[b, k]
            assert 1 <= n <= limits[b]
            assert (ids[b, k, n:] == PAD_ID).all() and (ids[b, k, :n] != PAD_ID).all()
            assert END_ID not in ids[b, k, : n - 1]
        assert ids[b, 0, lengths[b, 0] - 1] == END_ID or lengths[b, 0] == limits[b]


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_beam_search_dropping_stopped_sentences_changes_no_result(head_width):
    """Sentences leaving the beam loop as they stop (limits 1 … 20, graph mode) keep the
    hypotheses, scores and lengths they get when no sentence is dropped, and when searched alone."""
    model = tiny_model(seed=9, head_width=head_width)
    rows, src = padded_sources()
    rows, src = rows * 2, tf.concat([src, src], 0)
    limits = tf.constant([20, 1, 4, 12, 2, 7])
    run = by_drop_fraction(lambda s, n, drop_finished: decoding.beam_translate(
        model, s, 3, MAX_STEPS, alpha=0.6, max_lengths=n, drop_finished=drop_finished), (0.0, 0.75))
    kept, dropped = run[0.0](src, limits), run[0.75](src, limits)
    for field in ("ids", "lengths"):
        np.testing.assert_array_equal(getattr(dropped, field).numpy(), getattr(kept, field).numpy(), err_msg=field)
    np.testing.assert_allclose(dropped.scores.numpy(), kept.scores.numpy(), rtol=1e-6, atol=1e-6)
    assert kept.lengths.numpy()[:, 0].max() - kept.lengths.numpy()[:, 0].min() >= 10
    for i in (1, 3):
        alone = run[0.75](tf.constant([rows[i]], tf.int32), limits[i:i + 1])
        np.testing.assert_array_equal(alone.ids.numpy()[0], dropped.ids.numpy()[i], err_msg=f"sentence {i}")


@pytest.mark.parametrize("drop_finished", [0.0, 0.75])
@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_lean_beam_cache_kept_by_slot_equals_cache_gathered_by_parent(head_width, drop_finished):
    """The lean step's self-attention cache kept by beam slot and masked by lineage (never
    reordered) gives the hypotheses of the same step whose per-hypothesis cache is gathered by
    beam parent after every step, with and without stopped sentences leaving the loop."""
    model = tiny_model(seed=11, head_width=head_width)
    _, src = padded_sources()
    limits = tf.constant([20, 5, 14])
    k = 4

    def search(s, n, by_slot):
        memory, src_mask = model.encode(s, training=False)
        decoder = StepDecoder(model)
        context, cache = decoder.start(memory, src_mask)
        if by_slot:
            cache = decoder.slot_cache(tf.shape(s)[0], k)
        else:
            cache = tf.nest.map_structure(lambda x: decoding.tile_beams(x, k), cache)
        rows = {key: context[key] for key in decoding.ROW_CONTEXT}
        return decoding.beam_search(decoding.step_decoder_fn(decoder, context, k), tf.fill([tf.shape(s)[0]], START_ID),
                                    cache, k, MAX_STEPS, alpha=0.6, max_lengths=n, rows=rows,
                                    state_shape_invariants=decoder.cache_shape_invariants(cache),
                                    drop_finished=drop_finished, by_slot=by_slot)

    spec = SRC_SPEC + [tf.TensorSpec([None], tf.int32)]
    by_slot, by_parent = (graph(lambda s, n, b=b: search(s, n, b), input_signature=spec)(src, limits)
                          for b in (True, False))
    np.testing.assert_array_equal(by_slot.ids.numpy(), by_parent.ids.numpy())
    np.testing.assert_array_equal(by_slot.lengths.numpy(), by_parent.lengths.numpy())
    np.testing.assert_allclose(by_slot.scores.numpy(), by_parent.scores.numpy(), rtol=1e-5, atol=1e-5)
    assert by_parent.lengths.numpy()[0].max() > 5, "the search must run long enough for parents to change"


def test_beam_search_by_slot_needs_rows():
    with pytest.raises(ValueError, match="rows"):
        decoding.beam_search(step_dependent_fn(), tf.fill([1], START_ID), tf.zeros([1]), 2, 3, by_slot=True)
