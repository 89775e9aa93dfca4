"""Where greedy decoding's time goes: tokenization, encoder, decoder steps, projection, cache, loop.

    breakdown = decode_time_breakdown(translator, sentences)

Each part is timed on its own, in its own `tf.function`, on the very chunks the Translator
decodes (sentences sorted by length, `chunk_size` per chunk, padded as it pads them):

    tokenize       strings → source ids (sanitise, WordPiece, truncate), all sentences at once
    encoder        encoder + the cross-attention keys/values (`encode`, `StepDecoder.start`), per chunk
    decode_loop    the whole greedy loop of a chunk (`Translator._decode_ids`, encoder included)
    step           one decoder step `[chunk]` (`StepDecoder.step`: all decoder layers, the
                   self-attention cache update and the float32 projection) at the middle
                   step of the chunk (its cache half filled), called alone
    projection     the output projection + forbidden-token mask + argmax + log-softmax of one
                   step, on `[chunk, d_model]` (part of `step`)
    cache_update   appending one position to every layer's self-attention keys and values
                   (part of `step`)
    detokenize     generated ids → strings, all sentences at once

Derived: `decoder_steps` = Σ chunks `step` × steps the loop ran (the longest output of the
chunk); `decoder_layers` = that minus projection and cache updates; `loop_overhead` =
`decode_loop` − encoder − `decoder_steps` (the while loop's own ops, bookkeeping of finished
rows, and what one step costs more inside the loop than alone; negative if less). Each part is
the best of `repeats` timings. Without XLA only: an XLA loop is one compiled program.
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
    return tf.add_n([tf.reduce_sum(tf.cast(tf.reshape(t, [-1])[:1], tf.float32)) for t in tf.nest.flatten(outputs)])


def _timed(fn: Callable) -> Callable:
    """`fn` in a tf.function returning `_checksum` of its outputs."""
    return tf.function(lambda *args: _checksum(fn(*args)))


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
    """Times the parts of `translator`'s greedy decoding of `sentences` (see module docstring).

    Args:
        translator: a `transformer.inference.translator.Translator`, greedy, without XLA.
        sentences: the sentences.
        repeats: timings per part; the best is kept.

    Returns:
        JSON-ready dict: `seconds` (part → seconds over all sentences), `share` (part →
        fraction of `total`), `total` (tokenize + decode_loop + detokenize), `steps` (decoder
        steps run, summed over chunks), `chunks`.
    """
    if translator.config.beam_size != 1 or translator.config.jit_compile:
        raise ValueError("the breakdown times greedy decoding without XLA (beam_size 1, jit_compile False)")
    model = translator.model
    decoder = StepDecoder(model)
    text = tf.constant(list(sentences))
    tokenize = _timed(lambda: translator.source_ids(text)[0].flat_values)
    seconds = {"tokenize": _best_time(tokenize, repeats)}
    encode = tf.function(lambda src, filled: _encode(model, decoder, src, filled))
    encoder = _timed(lambda src: _encode(model, decoder, src, 0))
    decode = tf.function(translator._decode_ids_impl)
    loop = _timed(translator._decode_ids_impl)
    step = _timed(lambda ids, index, context, cache: decoder.step(context, ids, index, cache)[:2])
    projection = _timed(lambda x: _project(model, x))
    cache_update = _timed(lambda cache, row: [(tf.concat([k, row], 2), tf.concat([v, row], 2)) for k, v in cache])
    parts = {"encoder": 0.0, "decode_loop": 0.0, "step": 0.0, "projection": 0.0, "cache_update": 0.0}
    steps_total, generated = 0, []
    for src in translator_chunks(translator, sentences):
        batch = int(src.shape[0])
        ids, lengths = decode(src)
        steps = int(tf.reduce_max(lengths))
        steps_total += steps
        generated.append((ids, lengths))
        middle = tf.constant(steps // 2, tf.int32)
        context, cache = encode(src, middle)  # the cache filled up to the middle step
        start = tf.fill([batch], tf.constant(START_ID, tf.int32))
        x = tf.random.normal([batch, 1, model.config.d_model])
        new_row = tf.zeros_like(cache[0][0][:, :, :1])  # [B, heads, 1, key_dim]
        parts["encoder"] += _best_time(lambda: encoder(src), repeats)
        parts["decode_loop"] += _best_time(lambda: loop(src), repeats)
        parts["step"] += steps * _best_time(lambda: step(start, middle, context, cache), repeats)
        parts["projection"] += steps * _best_time(lambda: projection(x), repeats)
        parts["cache_update"] += steps * _best_time(lambda: cache_update(cache, new_row), repeats)
    width = max(int(ids.shape[1]) for ids, _ in generated)
    all_ids = tf.concat([tf.pad(ids, [[0, 0], [0, width - int(ids.shape[1])]]) for ids, _ in generated], 0)
    detokenize = _timed(lambda ids: tf.strings.length(translator.detokenize(ids)))
    seconds["detokenize"] = _best_time(lambda: detokenize(all_ids), repeats)
    seconds["encoder"] = parts["encoder"]
    seconds["decoder_steps"] = parts["step"]
    seconds["projection"] = parts["projection"]
    seconds["cache_update"] = parts["cache_update"]
    seconds["decoder_layers"] = parts["step"] - parts["projection"] - parts["cache_update"]
    seconds["loop_overhead"] = parts["decode_loop"] - parts["encoder"] - parts["step"]
    seconds["decode_loop"] = parts["decode_loop"]
    total = seconds["tokenize"] + parts["decode_loop"] + seconds["detokenize"]
    share_of = ("tokenize", "encoder", "decoder_layers", "projection", "cache_update", "loop_overhead", "detokenize")
    return {
        "sentences": len(sentences),
        "chunks": len(generated),
        "chunk_size": translator.config.chunk_size,
        "steps": steps_total,
        "total": round(total, 3),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "share": {k: round(seconds[k] / total, 3) for k in share_of},
        "per_step_ms": round(1000 * parts["step"] / max(steps_total, 1), 3),
    }


def _encode(model, decoder: StepDecoder, src, filled):
    """(context, cache with `filled` positions) of `decoder` for the chunk `src`."""
    memory, src_mask = model.encode(src, training=False)
    context, cache = decoder.start(memory, src_mask)
    padding = [[0, 0], [0, 0], [0, filled], [0, 0]]
    return context, [(tf.pad(k, padding), tf.pad(v, padding)) for k, v in cache]


def _project(model, x):
    logits = decoding._mask_forbidden(model.logits(x)[:, 0, :], decoding.DEFAULT_FORBIDDEN_IDS)
    next_ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return next_ids, tf.gather(tf.nn.log_softmax(logits), next_ids, batch_dims=1)


def format_breakdown(breakdown: dict) -> str:
    """Markdown table of `decode_time_breakdown`'s result."""
    lines = ["| part | seconds | share |", "|---|---|---|"]
    for part, share in breakdown["share"].items():
        lines.append(f"| {part} | {breakdown['seconds'][part]:.2f} | {100 * share:.1f}% |")
    lines.append(f"| **total** | {breakdown['total']:.2f} | 100% |")
    return "\n".join(lines)
