"""Choosing decoding settings by measurement: a length-penalty grid on validation, and
greedy vs beam speed measured *interleaved* in one process.

    grid = quality_grid(translator, sources, references, beams=[4], alphas=[0.0, 0.6, 1.0])
    speed = interleaved_speed({"greedy": fn1, "beam 4": fn2}, sources, rounds=3)

Interleaving (greedy, beam, greedy, beam, …) rather than one side after the other makes
load on a shared machine, CPU frequency and caches affect every decoder alike; each
decoder's rate is its best (fastest) round, and every round is kept in the report.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from transformer.inference.evaluation import score, timed_pass

TranslateFn = Callable[[Sequence[str]], tuple]  # sentences → (translations, num_tokens)


def decoder_name(beam_size: int, alpha: float) -> str:
    return "greedy" if beam_size == 1 else f"beam {beam_size}, alpha {alpha:g}"


def quality_grid(translator, sources: Sequence[str], references: Sequence[str], *, beams: Sequence[int],
                 alphas: Sequence[float]) -> list[dict]:
    """BLEU/chrF of greedy and of every (beam, alpha) pair on `sources`, best BLEU first.

    `translator`: a `transformer.inference.translator.Translator` (its other DecodeConfig fields are kept).
    Each entry: {"name", "beam_size", "alpha", "bleu", "bleu_lowercase", "chrf", "seconds",
    "output_tokens"} (seconds: one pass, compilation included: indicative only).
    """
    settings = [(1, 0.0)] + [(k, a) for k in beams if k > 1 for a in alphas]
    rows = []
    for beam_size, alpha in settings:
        decoder = translator.with_config(beam_size=beam_size, alpha=alpha)
        translations, tokens, seconds = timed_pass(decoder.translate_with_lengths, sources)
        quality = score(translations, references)
        rows.append({"name": decoder_name(beam_size, alpha), "beam_size": beam_size, "alpha": alpha,
                     **{k: quality[k] for k in ("bleu", "bleu_lowercase", "chrf")},
                     "seconds": round(seconds, 2), "output_tokens": tokens})
    return sorted(rows, key=lambda row: -row["bleu"])


def best_alpha(grid: Sequence[dict], beam_size: int) -> float:
    """The alpha with the highest BLEU for `beam_size` in a `quality_grid` (ties: the first)."""
    rows = [row for row in grid if row["beam_size"] == beam_size]
    if not rows:
        raise ValueError(f"no beam size {beam_size} in the grid")
    return max(rows, key=lambda row: row["bleu"])["alpha"]


def interleaved_speed(decoders: dict[str, TranslateFn], sources: Sequence[str], *, rounds: int = 2,
                      warmup: int = 16) -> dict:
    """Sentences/s of each decoder over `sources`, timed in interleaved rounds (rounds >= 1).

    Every decoder first translates the first `warmup` sentences untimed (tracing; one trace
    serves every batch without XLA — with XLA, shapes not seen yet compile in round 1, so
    use rounds >= 2); then each round times one pass of every decoder in turn. Returns
    {name: {"sentences_per_s" (best round), "tokens_per_s", "rounds_s" (every round's
    seconds), "output_tokens", "translations"}}; a decoder whose passes disagree raises
    RuntimeError.
    """
    results: dict[str, dict] = {}
    for fn in decoders.values():
        timed_pass(fn, sources[:warmup])
    for _ in range(max(rounds, 1)):
        for name, fn in decoders.items():
            translations, tokens, seconds = timed_pass(fn, sources)
            entry = results.setdefault(name, {"rounds_s": [], "output_tokens": tokens, "translations": translations})
            if translations != entry["translations"]:
                raise RuntimeError(f"{name}: translations changed between passes over the same input")
            entry["rounds_s"].append(round(seconds, 3))
    for entry in results.values():
        best = max(min(entry["rounds_s"]), 1e-6)
        entry["sentences_per_s"] = round(len(sources) / best, 2)
        entry["tokens_per_s"] = round(entry["output_tokens"] / best, 1) if entry["output_tokens"] else None
    return results


def wall_clock() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
