"""The lean one-token step (transformer/model/step_decoder.py) computes the model's function:
its logits equal the full teacher-forced pass at every real position, for every architecture
knob that changes the decoder (head width, norm position, tied projection) and in bfloat16."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers_model import TINY_MODEL, build, random_ids

from transformer.base.constants import PAD_ID
from transformer.model.step_decoder import ALIASING_PAD, ALIASING_WIDTH, StepDecoder
from transformer.model.transformer import Transformer


def step_logits(model, src, tgt):
    """Logits `[B, T, V]` and last-layer cross-attention `[B, T, heads, S]` from StepDecoder, one token at a time."""
    decoder = StepDecoder(model)
    memory, src_mask = model.encode(src)
    context, cache = decoder.start(memory, src_mask)
    logits, scores = [], []
    for index in range(tgt.shape[1]):
        step_logits, cache, step_scores = decoder.step(context, tf.constant(tgt[:, index]), tf.constant(index), cache)
        assert all(k.shape[2] == index + 1 and v.shape[2] == index + 1 for k, v in cache)  # filled positions only
        logits.append(step_logits.numpy())
        scores.append(step_scores.numpy())
    return np.stack(logits, axis=1), np.stack(scores, axis=1)


@pytest.mark.parametrize("changes", [
    {},  # tutorial head width (key_dim = d_model)
    {"head_width": "paper"},
    {"head_width": "paper", "layer_norm": "pre"},
    {"head_width": "paper", "tie_embeddings": "output"},
])
def test_step_logits_equal_the_full_pass(changes):
    config = dataclasses.replace(TINY_MODEL, **changes)
    model = build(config, seed=7)
    src, tgt = random_ids(config)
    full, full_scores = model.decode(tf.constant(tgt), *model.encode(src))
    logits, scores = step_logits(model, src, tgt)
    real = tgt != PAD_ID  # pads only at the end: every real position precedes them
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits[real], full.numpy()[real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(scores[real], np.transpose(full_scores.numpy(), [0, 2, 1, 3])[real], atol=1e-6, rtol=0)


def test_weights_padded_off_the_aliasing_width_give_the_full_pass():
    """Query/key/value and FFN inner widths that are multiples of `ALIASING_WIDTH` get zero
    columns in the step (a float32 speed fix); the logits are still the full pass's."""
    config = dataclasses.replace(TINY_MODEL, d_model=ALIASING_WIDTH, num_heads=2, dff=ALIASING_WIDTH,
                                 head_width="paper")
    model = build(config, seed=9)
    src, tgt = random_ids(config)
    context, _ = StepDecoder(model).start(*model.encode(src))
    weights = context["weights"][0]
    assert weights["qkv"].shape == (ALIASING_WIDTH, 3 * ALIASING_WIDTH + ALIASING_PAD)
    assert weights["ffn_inner"].shape == (ALIASING_WIDTH, ALIASING_WIDTH + ALIASING_PAD)
    full = model.decode(tf.constant(tgt), *model.encode(src))[0].numpy()
    logits, _ = step_logits(model, src, tgt)
    real = tgt != PAD_ID
    np.testing.assert_allclose(logits[real], full[real], atol=1e-5, rtol=0)


def test_bfloat16_step_stays_close_and_returns_float32_logits():
    config = dataclasses.replace(TINY_MODEL, head_width="paper")
    model = build(config, seed=8)
    copy = Transformer.from_model_config(config, dtype="bfloat16")
    copy.build()
    for weight, value in zip(copy.weights, model.weights):
        weight.assign(tf.cast(value, weight.dtype))
    src, tgt = random_ids(config)
    full = model.decode(tf.constant(tgt), *model.encode(src))[0].numpy()
    logits, _ = step_logits(copy, src, tgt)
    real = tgt != PAD_ID
    assert logits.dtype == np.float32
    scale = np.abs(full[real]).max()
    assert np.abs(logits[real] - full[real]).max() < 0.05 * scale  # bfloat16 rounding, not another function
    keras.backend.clear_session()


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_hypotheses_attending_per_source_row_equal_tiled_rows(head_width):
    """`group` hypotheses per source row over untiled cross-attention keys/values (beam search)
    give the logits and cross-attention of the same rows with the source tiled per hypothesis."""
    config = dataclasses.replace(TINY_MODEL, head_width=head_width)
    model = build(config, seed=11)
    src, tgt = random_ids(config)
    group = 3
    decoder = StepDecoder(model)
    memory, src_mask = model.encode(src)
    context, cache = decoder.start(memory, src_mask)
    tiled = {**context, "cross": tf.nest.map_structure(lambda x: tf.repeat(x, group, axis=0), context["cross"]),
             "bias": tf.repeat(context["bias"], group, axis=0)}
    tile = lambda x: tf.repeat(x, group, axis=0)  # noqa: E731
    ids = tf.constant(np.repeat(tgt, group, axis=0))  # [B·G, T]
    ids = tf.tensor_scatter_nd_update(ids, [[1, 1], [4, 2]], [5, 6])  # hypotheses of a sentence differ
    grouped_cache = alone_cache = tf.nest.map_structure(tile, cache)
    for index in range(4):
        grouped, grouped_cache, grouped_scores = decoder.step(context, ids[:, index], tf.constant(index),
                                                              grouped_cache, group)
        alone, alone_cache, alone_scores = decoder.step(tiled, ids[:, index], tf.constant(index), alone_cache)
        np.testing.assert_allclose(grouped.numpy(), alone.numpy(), atol=1e-5, rtol=0)
        np.testing.assert_allclose(grouped_scores.numpy(), alone_scores.numpy(), atol=1e-6, rtol=0)
    assert not np.allclose(grouped.numpy()[0], grouped.numpy()[1])  # different hypotheses, different logits


def test_bfloat16_projection_rounds_only_the_logits_matmul():
    """projection_dtype="bfloat16": logits = bfloat16(x · W) + float32 bias, returned as float32 and
    within bfloat16 rounding of the float32 projection; anything else is refused."""
    config = dataclasses.replace(TINY_MODEL, head_width="paper")
    model = build(config, seed=13)
    src, tgt = random_ids(config)
    memory, src_mask = model.encode(src)
    ids, index = tf.constant(tgt[:, 0]), tf.constant(0)
    outputs = {}
    for dtype in ("float32", "bfloat16"):
        decoder = StepDecoder(model, projection_dtype=dtype)
        context, cache = decoder.start(memory, src_mask)
        outputs[dtype] = decoder.step(context, ids, index, cache)[0].numpy()
    bias = model.final_layer.bias.numpy()
    product = outputs["bfloat16"] - bias
    assert outputs["bfloat16"].dtype == np.float32
    np.testing.assert_array_equal(tf.cast(tf.cast(product, tf.bfloat16), tf.float32).numpy(), product)
    assert not np.array_equal(outputs["bfloat16"], outputs["float32"])
    scale = np.abs(outputs["float32"] - bias).max()
    np.testing.assert_allclose(outputs["bfloat16"], outputs["float32"], atol=0.01 * scale, rtol=0)
    with pytest.raises(ValueError, match="projection_dtype must be auto, float32 or bfloat16"):
        StepDecoder(model, projection_dtype="float16")


def test_auto_projection_follows_the_models_compute_dtype():
    """projection_dtype="auto" (DecodeConfig's default): a float32 model projects in float32, a
    bfloat16 copy (`cast_model`, the bfloat16 export's) in bfloat16: the same logits as naming it."""
    from transformer.inference.rundir import cast_model

    model = build(dataclasses.replace(TINY_MODEL, head_width="paper"), seed=13)
    src, tgt = random_ids(model.config)
    ids, index = tf.constant(tgt[:, 0]), tf.constant(0)

    def logits(model, projection_dtype):
        decoder = StepDecoder(model, projection_dtype=projection_dtype)
        memory, src_mask = model.encode(src)
        context, cache = decoder.start(memory, src_mask)
        return decoder.projection_dtype, decoder.step(context, ids, index, cache)[0].numpy()

    bf16 = cast_model(model, "bfloat16")
    for model_, expected in ((model, tf.float32), (bf16, tf.bfloat16)):
        dtype, auto = logits(model_, "auto")
        assert dtype == expected
        np.testing.assert_array_equal(auto, logits(model_, expected.name)[1])
    assert not np.array_equal(logits(bf16, "auto")[1], logits(bf16, "float32")[1])


@pytest.mark.parametrize("head_width", ["tutorial", "paper"])
def test_slot_cache_with_lineage_equals_cache_gathered_by_parent(head_width):
    """Hypotheses reordered by random parents every step: the cache kept by slot, attended through
    each hypothesis's lineage, gives the logits of the per-hypothesis cache gathered by parent."""
    config = dataclasses.replace(TINY_MODEL, head_width=head_width)
    model = build(config, seed=12)
    src, tgt = random_ids(config)
    batch, group = src.shape[0], 3
    decoder = StepDecoder(model)
    memory, src_mask = model.encode(src)
    context, cache = decoder.start(memory, src_mask)
    gathered = tf.nest.map_structure(lambda x: tf.repeat(x, group, axis=0), cache)
    slots, lineage = decoder.slot_cache(batch, group), tf.zeros([batch, group, 0], tf.int32)
    rng = np.random.default_rng(0)
    ids = tf.constant(np.repeat(tgt, group, axis=0))  # [B·G, T]
    for index in range(5):
        lineage = tf.concat([lineage, tf.tile(tf.range(group)[tf.newaxis, :, tf.newaxis], [batch, 1, 1])], axis=2)
        by_parent, gathered, _ = decoder.step(context, ids[:, index], tf.constant(index), gathered, group)
        by_slot, slots, _ = decoder.step(context, ids[:, index], tf.constant(index), slots, group, lineage)
        np.testing.assert_allclose(by_slot.numpy(), by_parent.numpy(), atol=1e-5, rtol=0, err_msg=f"step {index}")
        parents = tf.constant(rng.integers(0, group, size=(batch, group)), tf.int32)
        rows = tf.reshape(parents + group * tf.range(batch)[:, tf.newaxis], [-1])
        gathered = tf.nest.map_structure(lambda x: tf.gather(x, rows), gathered)
        lineage = tf.gather(lineage, parents, batch_dims=1)
        ids = tf.gather(ids, rows)
    assert all(k.shape == (batch, config.num_heads, group, 5, config.key_dim) for k, _ in slots)
    with pytest.raises(ValueError, match="not both"):
        decoder.step(context, ids[:, 0], tf.constant(5), slots, group, lineage, self_bias=tf.zeros([1, 1, 1, 6]))


@pytest.mark.parametrize("tie", ["none", "output"])
def test_forbidden_ids_are_neg_inf_in_the_bias_and_never_generated(tie):
    """`forbidden_ids` go into the projection's bias: those logits are NEG_INF, the others
    unchanged, and greedy and beam decoding of a model that prefers them never emit them."""
    from transformer.base.constants import START_ID
    from transformer.inference import decoding

    config = dataclasses.replace(TINY_MODEL, head_width="paper", tie_embeddings=tie)
    model = build(config, seed=9)
    model.final_layer.bias.assign(tf.tensor_scatter_nd_update(  # PAD and START far ahead of every other token
        model.final_layer.bias, [[PAD_ID], [START_ID]], [50.0, 40.0]))
    src, tgt = random_ids(config)
    memory, src_mask = model.encode(src)
    outputs = {}
    for forbidden in ((), (PAD_ID, START_ID)):
        decoder = StepDecoder(model, forbidden_ids=forbidden)
        context, cache = decoder.start(memory, src_mask)
        outputs[forbidden] = decoder.step(context, tf.constant(tgt[:, 0]), tf.constant(0), cache)[0].numpy()
    plain, masked = outputs[()], outputs[(PAD_ID, START_ID)]
    assert (plain.argmax(-1) == PAD_ID).all()  # the model prefers PAD: the test can tell
    assert (masked[:, [PAD_ID, START_ID]] < -1e8).all()
    others = np.ones(plain.shape[1], bool)
    others[[PAD_ID, START_ID]] = False
    np.testing.assert_array_equal(masked[:, others], plain[:, others])
    greedy = decoding.greedy_translate(model, tf.constant(src), 8)
    beam = decoding.beam_translate(model, tf.constant(src), 3, 8)
    generated = [row[:n] for row, n in zip(greedy.ids.numpy(), greedy.lengths.numpy())]
    generated += [row[:n] for rows, lengths in zip(beam.ids.numpy(), beam.lengths.numpy())
                  for row, n in zip(rows, lengths)]
    assert all(len(row) and PAD_ID not in row and START_ID not in row for row in generated)


def test_a_step_reads_no_variable_and_stays_lean():
    """Every weight is read once per batch (`start`); a step runs its kernels only. A step's
    op count is its fixed cost on a CPU (each op a dispatch: ~12 µs on an AVX2 EPYC), so
    extra ops per layer (a variable read, a transpose for one position) would fail here."""
    config = dataclasses.replace(TINY_MODEL, head_width="paper")
    model = build(config, seed=7)
    decoder = StepDecoder(model)
    src, _ = random_ids(config)
    context, cache = decoder.start(*model.encode(src))
    ids = tf.fill([src.shape[0]], 2)

    @tf.function
    def step(context, ids, cache):
        return decoder.step(context, ids, tf.constant(0), cache)[0]

    graph = step.get_concrete_function(context, ids, cache).graph
    types = [op.type for op in graph.get_operations() if op.type not in ("Placeholder", "Const", "NoOp", "Identity")]
    assert types.count("ReadVariableOp") == 1, types  # the target embedding's gather only
    assert "Transpose" not in types and "StopGradient" not in types, types
    per_layer = (len(types) - 10) / config.num_layers  # embedding, position, projection: ~10 ops
    assert per_layer <= 62, (per_layer, sorted(types))  # 61 per post-norm layer at 193 ops for 3 layers
