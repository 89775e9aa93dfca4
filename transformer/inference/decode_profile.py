"""Where decoding's time goes: tokenization, encoder, decoder steps, projection, selection, cache, loop.

    breakdown = decode_time_breakdown(translator, sentences)

Greedy or beam search, as the translator decodes. Each part is timed on its own, in its own
`tf.function`, on the very chunks the Translator decodes (sentences sorted by length,
`chunk_size` per chunk, padded as it pads them); a step has `rows` = chunk × beam size rows:

    tokenize       strings → source ids (sanitise, WordPiece, truncate), all sentences at once
    encoder        encoder + the cross-attention keys/values (`encode`, `StepDecoder.start`), per chunk
    decode_loop    the whole decoding loop of a chunk (`Translator._decode_ids_impl`, encoder included)
    step           one decoder step `[rows]` (`StepDecoder.step`: all decoder layers, the
                   self-attention cache update and the float32 projection; beam search: the
                   cache kept by slot and masked by a lineage) at the middle step of the
                   chunk (its cache half filled), called alone
    projection     the output projection `[rows, d_model] × [d_model, vocab]` + bias (part of `step`)
    cache_update   appending one position to every layer's self-attention keys and values
                   (part of `step`)
    selection      the next tokens from the logits `[rows, vocab]` (forbidden tokens are already
                   NEG_INF: the projection's bias): argmax (greedy) or each hypothesis's beam-size
                   best tokens and their log-probabilities (beam search)
    detokenize     generated ids → strings, all sentences at once

Derived: `decoder_steps` = Σ chunks `step` × steps the loop ran (the longest hypothesis of the
chunk); `decoder_layers` = that minus projection and cache updates; `loop_overhead` =
`decode_loop` − encoder − steps × (step + selection) (the while loop's own
ops, the bookkeeping of finished rows and hypotheses, and what a step costs more inside the
loop than alone; negative if less: steps are timed with every row, while the loop drops rows
that have finished). Each part is the best of `repeats` timings. Without XLA only: an XLA loop
is one compiled program.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from transformer.base.constants import START_ID
from transformer.inference import decoding
from transformer.model.step_decoder import StepDecoder


def _checksum(outputs) -> tf.Tensor:
    """A float32 scalar that depends on every output tensor: fetching it forces the computation
    without copying large outputs (the caches) to the host, which would be timed too."""
    return tf.add_n([tf.reduce_sum(tf.cast(tf.reshape(t, [-1])[:1], tf.float32)) for t in tf.nest.flatten(outputs)
                     if t is not None])  # None: e.g. a context without a final norm


def _timed(fn: Callable) -> Callable:
    """`fn` in a tf.function returning `_checksum` of its outputs."""
    return tf.function(lambda *args: _checksum(fn(*args)), autograph=False)


def _best_time(fn: Callable, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls of `fn` (after one warm-up call)."""
    fn().numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn().numpy()
        best = min(best, time.perf_counter() - start)
    return best


def translator_chunks(translator, sentences: Sequence[str]) -> list[tf.Tensor]:
    """The Translator's chunks: int32 `[chunk, src_len]` ids, sorted by length, padded to
    the chunk's longest source (rows without tokens left out)."""
    src, has_tokens = translator.source_ids(tf.constant(list(sentences)))
    lengths = src.row_lengths().numpy()
    order = np.argsort(lengths, kind="stable")
    order = order[has_tokens.numpy()[order]]
    size = translator.config.chunk_size
    return [tf.cast(tf.gather(src, order[i: i + size]).to_tensor(), tf.int32) for i in range(0, len(order), size)]


def decode_time_breakdown(translator, sentences: Sequence[str], *, repeats: int = 3) -> dict:
    """Times the parts of `translator`'s decoding of `sentences` (see module docstring).

    Args:
        translator: a `transformer.inference.translator.Translator` without XLA (greedy or beam).
        sentences: the sentences.
        repeats: timings per part; the best is kept.

    Returns:
        JSON-ready dict: `seconds` (part → seconds over all sentences), `share` (part →
        fraction of `total`), `total` (tokenize + decode_loop + detokenize), `steps` (decoder
        steps run, summed over chunks), `chunks`, `beam_size`.
    """
    if translator.config.jit_compile:
        raise ValueError("the breakdown times decoding without XLA (jit_compile False)")
    model, beam = translator.model, translator.config.beam_size
    decoder = StepDecoder(model, forbidden_ids=decoding.DEFAULT_FORBIDDEN_IDS)  # as the Translator's
    text = tf.constant(list(sentences))
    tokenize = _timed(lambda: translator.source_ids(text)[0].flat_values)
    seconds = {"tokenize": _best_time(tokenize, repeats)}
    encode = tf.function(lambda src, filled: _encode(model, decoder, src, filled, beam), autograph=False)
    encoder = _timed(lambda src: _encode(model, decoder, src, 0, 1))
    search = tf.function(lambda src: _search(translator, src), autograph=False)
    loop = _timed(translator._decode_ids_impl)
    step = _timed(lambda ids, index, context, cache, lineage: decoder.step(context, ids, index, cache, beam,
                                                                           lineage)[:2])
    projection = _timed(lambda x, output: tf.matmul(x, output[0]) + output[1])
    selection = _timed(lambda logits: _select(logits, beam))
    cache_update = _timed(lambda cache, row: [(tf.concat([k, row], -2), tf.concat([v, row], -2)) for k, v in cache])
    parts = dict.fromkeys(("encoder", "decode_loop", "step", "projection", "cache_update", "selection"), 0.0)
    steps_total, generated = 0, []
    for src in translator_chunks(translator, sentences):
        rows = int(src.shape[0]) * beam
        ids, lengths, steps = search(src)
        steps = int(steps)
        steps_total += steps
        generated.append((ids, lengths))
        middle = tf.constant(steps // 2, tf.int32)
        context, cache = encode(src, middle)  # the cache filled up to the middle step
        start = tf.fill([rows], tf.constant(START_ID, tf.int32))
        x = tf.random.normal([rows, model.config.d_model])
        logits = tf.random.normal([rows, model.config.tgt_vocab_size])
        new_row = tf.zeros_like(cache[0][0][..., :1, :])  # one position per row (per slot in beam search)
        # Beam search: each hypothesis's positions held by random slots of its sentence.
        lineage = tf.random.uniform([rows // beam, beam, steps // 2 + 1], 0, beam, tf.int32) if beam > 1 else None
        timed = {"encoder": (encoder, src), "decode_loop": (loop, src),
                 "step": (step, start, middle, context, cache, lineage),
                 "projection": (projection, x, context["output"]), "selection": (selection, logits),
                 "cache_update": (cache_update, cache, new_row)}
        for part, (fn, *args) in timed.items():
            once = _best_time(lambda: fn(*args), repeats)
            parts[part] += once if part in ("encoder", "decode_loop") else steps * once
    width = max(int(ids.shape[1]) for ids, _ in generated)
    all_ids = tf.concat([tf.pad(ids, [[0, 0], [0, width - int(ids.shape[1])]]) for ids, _ in generated], 0)
    detokenize = _timed(lambda ids: tf.strings.length(translator.detokenize(ids)))
    seconds["detokenize"] = _best_time(lambda: detokenize(all_ids), repeats)
    seconds["encoder"] = parts["encoder"]
    seconds["decoder_steps"] = parts["step"]
    for part in ("projection", "cache_update", "selection"):
        seconds[part] = parts[part]
    seconds["decoder_layers"] = parts["step"] - parts["projection"] - parts["cache_update"]
    seconds["loop_overhead"] = parts["decode_loop"] - parts["encoder"] - parts["step"] - parts["selection"]
    seconds["decode_loop"] = parts["decode_loop"]
    total = seconds["tokenize"] + parts["decode_loop"] + seconds["detokenize"]
    share_of = ("tokenize", "encoder", "decoder_layers", "projection", "cache_update", "selection",
                "loop_overhead", "detokenize")
    return {
        "sentences": len(sentences),
        "chunks": len(generated),
        "chunk_size": translator.config.chunk_size,
        "beam_size": beam,
        "steps": steps_total,
        "total": round(total, 3),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "share": {k: round(seconds[k] / total, 3) for k in share_of},
        "per_step_ms": round(1000 * parts["step"] / max(steps_total, 1), 3),
    }


def _encode(model, decoder: StepDecoder, src, filled, beam: int):
    """(context, cache with `filled` positions) of `decoder` for the chunk `src`; with `beam` > 1
    the cache beam search keeps (`slot_cache`'s layout, `beam` slots per sentence)."""
    memory, src_mask = model.encode(src, training=False)
    context, cache = decoder.start(memory, src_mask)
    padding = [[0, 0], [0, 0], [0, filled], [0, 0]]
    if beam == 1:
        return context, [(tf.pad(k, padding), tf.pad(v, padding)) for k, v in cache]

    def by_slot(x):  # [B, N, 0, H] → [B, N, beam, filled, H]
        return tf.tile(tf.pad(x, padding)[:, :, tf.newaxis], [1, 1, beam, 1, 1])

    return context, [(by_slot(k), by_slot(v)) for k, v in cache]


def _search(translator, src):
    """The translator's decoding of the chunk `src` → (best ids `[b, T]`, lengths `[b]`, steps the
    loop ran: the longest hypothesis, finished or not)."""
    config = translator.config
    max_steps, limits = translator._max_steps(tf.shape(src)[1]), translator._row_limits(src)
    if config.beam_size == 1:
        result = decoding.greedy_translate(translator.model, src, max_steps, max_lengths=limits)
        return result.ids, result.lengths, tf.reduce_max(result.lengths)
    result = decoding.beam_translate(translator.model, src, config.beam_size, max_steps, alpha=config.alpha,
                                     max_lengths=limits)
    return result.ids[:, 0], result.lengths[:, 0], tf.reduce_max(result.lengths)


def _select(logits, beam: int):
    """The loop's token choice from logits `[rows, vocab]` (see module docstring: selection)."""
    if beam > 1:
        return decoding._beam_candidates(logits, beam)
    return tf.argmax(logits, axis=-1, output_type=tf.int32)  # the Translator's greedy loop sums no log-probabilities


def format_breakdown(breakdown: dict) -> str:
    """Markdown table of `decode_time_breakdown`'s result."""
    lines = ["| part | seconds | share |", "|---|---|---|"]
    for part, share in breakdown["share"].items():
        lines.append(f"| {part} | {breakdown['seconds'][part]:.2f} | {100 * share:.1f}% |")
    lines.append(f"| **total** | {breakdown['total']:.2f} | 100% |")
    return "\n".join(lines)
