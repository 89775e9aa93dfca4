"""Translation quality (sacrebleu BLEU and chrF) and decoding speed, reported as JSON.

    sources, references = data.load_split(data_dir="../shared/data/bible-pt-en", split="validation")
    report = evaluate(translator.translate_with_lengths, sources, references)
    save_report(report, "eval.json")

Speed is measured honestly: a *cold* pass (tracing, XLA compilation, first-call costs
included) and then `repeats` *warm* passes over the same sentences; `sentences_per_s` and
`tokens_per_s` come from the fastest warm pass (the cold figures are reported beside them).
Tokens are generated target wordpieces, [END] included (one decoder step each).

BLEU/chrF are sacrebleu's corpus scores on detokenized, cased references against the
system output as produced (the default tokenizers lower-case, so expect a lower BLEU than
with `lowercase=True`, which is also reported).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from transformer.base import atomic

TranslateFn = Callable[[Sequence[str]], tuple]  # sentences → (translations, num_tokens or None)


def score(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """sacrebleu corpus BLEU (cased and lower-cased) and chrF, with their signatures."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    refs = [list(references)]
    bleu = sacrebleu.metrics.BLEU()
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    bleu_lc = sacrebleu.metrics.BLEU(lowercase=True)
    bleu_lc_score = bleu_lc.corpus_score(list(hypotheses), refs)
    chrf = sacrebleu.metrics.CHRF()
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_lowercase": round(bleu_lc_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_detail": str(bleu_score),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_lowercase_signature": str(bleu_lc.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def timed_pass(translate_fn: TranslateFn, sentences: Sequence[str]) -> tuple[list[str], Optional[int], float]:
    """(translations, generated tokens or None, seconds) for one pass of `translate_fn`."""
    start = time.perf_counter()
    translations, num_tokens = translate_fn(list(sentences))
    seconds = time.perf_counter() - start
    return list(translations), None if num_tokens is None else int(np.sum(num_tokens)), seconds


def concurrent_calls(translate_fn: TranslateFn, batch_size: int, streams: int) -> TranslateFn:
    """`translate_fn` called on length-sorted batches, `streams` calls at once.

    The returned TranslateFn sorts its sentences by characters, cuts them into calls of
    `batch_size` and runs them on `streams` threads (a TensorFlow call releases the GIL), as
    a server with `streams` decoder threads would; translations come back in input order.
    """
    from concurrent.futures import ThreadPoolExecutor

    def translate(sentences):
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
        calls = [[sentences[i] for i in order[k:k + batch_size]] for k in range(0, len(order), batch_size)]
        with ThreadPoolExecutor(streams) as pool:
            results = list(pool.map(translate_fn, calls))
        texts, lengths = [""] * len(sentences), np.zeros(len(sentences), np.int64)
        flat = [(t, n) for translations, counts in results for t, n in zip(translations, counts)]
        for i, (text, count) in zip(order, flat):
            texts[i], lengths[i] = text, count
        return texts, lengths

    return translate


def speed(num_sentences: int, num_tokens: Optional[int], seconds: float) -> dict:
    return {
        "sentences": num_sentences,
        "seconds": round(seconds, 3),
        "sentences_per_s": round(num_sentences / seconds, 3) if seconds > 0 else None,
        "output_tokens": num_tokens,
        "tokens_per_s": round(num_tokens / seconds, 1) if (num_tokens is not None and seconds > 0) else None,
    }


def evaluate(translate_fn: TranslateFn, sources: Sequence[str], references: Sequence[str], *,
             repeats: int = 1, description: Optional[dict] = None) -> dict:
    """Translates `sources`, scores against `references`, measures speed (see module docstring).

    Returns a JSON-ready dict: quality scores, `speed` (best warm pass, or the cold one when
    `repeats` is 0), `speed_cold`, and `examples` (the first five triples).
    """
    hypotheses, tokens, cold_s = timed_pass(translate_fn, sources)
    warm = []
    for _ in range(repeats):
        again, again_tokens, seconds = timed_pass(translate_fn, sources)
        if again != hypotheses:  # decoding is deterministic; a difference is a bug worth seeing
            raise RuntimeError("translations changed between passes over the same input")
        warm.append(seconds)
    best = min(warm) if warm else cold_s
    return {
        **(description or {}),
        "num_sentences": len(sources),
        **score(hypotheses, references),
        "speed": {**speed(len(sources), tokens, best), "pass": "warm" if warm else "cold"},
        "speed_cold": speed(len(sources), tokens, cold_s),
        "warm_pass_seconds": [round(s, 3) for s in warm],
        "examples": [{"source": s, "reference": r, "translation": h}
                     for s, r, h in list(zip(sources, references, hypotheses))[:5]],
        "translations": hypotheses,
    }


def save_report(report: dict, path: str | Path) -> Path:
    """Writes `report` as indented JSON (atomically: temp file, then rename)."""
    return atomic.write_json(path, report, ensure_ascii=False)


# ---- decoding-speed benchmark: cached batched vs the tutorial's loop ------------------------
def tutorial_translate_fn(translator) -> TranslateFn:
    """The TF tutorial Translator's design as a `TranslateFn`: one sentence at a time, no cache,
    the full model (encoder included) re-run on the whole prefix every step, up to the model's
    max_length tokens (`decoding.uncached_greedy_decode`, in a tf.function). Same tokenizers,
    sanitising and pieces of long sources as `translator` (each piece decoded alone, the
    translations joined); no output bound relative to the source.
    (The tutorial also re-runs the model once more per sentence to fetch attention weights;
    that pass is left out, which flatters the baseline.)
    """
    import tensorflow as tf

    from transformer.inference import decoding, segmenting

    max_steps = translator.max_length

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
    def translate_one(sentence):
        src, has_tokens = translator.source_ids(sentence[tf.newaxis])
        ids = decoding.uncached_greedy_decode(translator.model, tf.cast(src.to_tensor(), tf.int32), max_steps)
        return translator.texts(ids, has_tokens)[0], tf.where(has_tokens[0], tf.shape(ids)[1], 0)

    cut = tf.function(translator.pieces, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)

    def translate(sentences):
        texts, tokens = [], 0
        for sentence in sentences:
            parts = []
            for piece in cut(tf.constant([sentence]))[0]:  # one piece unless over max_length
                text, n = translate_one(piece)
                parts.append(text.numpy().decode("utf-8"))
                tokens += int(n)
            texts.append(segmenting.join_texts(parts))
        return texts, tokens

    return translate


def benchmark_decoding(translator, sources: Sequence[str], references: Optional[Sequence[str]] = None, *,
                       baseline_sentences: int = 50, repeats: int = 1, cached_batch_one: bool = True) -> dict:
    """Cached batched decoding (`translator`, all `sources`) vs the tutorial's batch-1 uncached loop
    (the first `baseline_sentences` sources), on the same model. See scripts/benchmark_decoding.py.

    Both sides are warmed up first (tracing, XLA compilation) and timed afterwards; the cached
    side's cold pass is reported too. Returns a JSON-ready dict with `speedup` =
    cached batched sentences/s (all sentences) ÷ tutorial loop sentences/s (subset).
    """
    subset = list(sources[:baseline_sentences])
    report: dict = {"num_sentences": len(sources), "baseline_sentences": len(subset)}

    cached, tokens, cold_s = timed_pass(translator.translate_with_lengths, sources)
    warm = [timed_pass(translator.translate_with_lengths, sources)[2] for _ in range(repeats)]
    report["cached_batched"] = {
        "decode": translator.config.to_dict(),
        "cold": speed(len(sources), tokens, cold_s),
        "warm": speed(len(sources), tokens, min(warm) if warm else cold_s),
    }
    if references is not None:
        report["cached_batched"]["quality"] = {k: v for k, v in score(cached, references).items()
                                               if k in ("bleu", "bleu_lowercase", "chrf", "bleu_signature")}

    baseline = tutorial_translate_fn(translator)
    baseline(subset[:1])  # trace once; tracing is not decoding speed
    uncached, base_tokens, base_s = timed_pass(baseline, subset)
    report["uncached_batch1"] = {
        "what": f"tutorial loop: batch 1, no cache, full model re-run each step, max {translator.max_length} "
                f"tokens; first {len(subset)} sentences",
        **speed(len(subset), base_tokens, base_s),
    }

    timed_pass(translator.translate_with_lengths, subset)  # warm-up: the subset's own shapes (XLA)
    same = timed_pass(translator.translate_with_lengths, subset)
    report["cached_batched_on_baseline_subset"] = speed(len(subset), same[1], same[2])
    # Without the source-relative output bound, cached decoding must reproduce the tutorial
    # loop's output exactly (same model, same max_length): a correctness check at full scale,
    # and a speed comparison at identical output lengths.
    unbounded = translator.with_config(max_output_ratio=float(translator.max_length), max_output_extra=0)
    timed_pass(unbounded.translate_with_lengths, subset)  # warm-up (new shapes)
    full = timed_pass(unbounded.translate_with_lengths, subset)
    report["cached_batched_unbounded_on_baseline_subset"] = speed(len(subset), full[1], full[2])
    report["identical_to_uncached_when_unbounded"] = round(
        sum(a == b for a, b in zip(full[0], uncached)) / max(len(subset), 1), 3)
    report["identical_to_uncached_with_bound"] = round(
        sum(a == b for a, b in zip(same[0], uncached)) / max(len(subset), 1), 3)
    if cached_batch_one:
        one = translator.with_config(chunk_size=1)
        timed_pass(one.translate_with_lengths, subset[:2])  # warm-up
        _, one_tokens, one_s = timed_pass(one.translate_with_lengths, subset)
        report["cached_batch1_on_baseline_subset"] = speed(len(subset), one_tokens, one_s)

    base_rate = report["uncached_batch1"]["sentences_per_s"]
    report["speedup"] = round(report["cached_batched"]["warm"]["sentences_per_s"] / base_rate, 1)
    report["speedup_cold"] = round(report["cached_batched"]["cold"]["sentences_per_s"] / base_rate, 1)
    report["speedup_same_subset"] = round(report["cached_batched_on_baseline_subset"]["sentences_per_s"] / base_rate, 1)
    report["speedup_same_subset_unbounded"] = round(
        report["cached_batched_unbounded_on_baseline_subset"]["sentences_per_s"] / base_rate, 1)
    report["examples"] = [{"source": s, "cached": c, "uncached": u} for s, c, u in zip(subset, same[0], uncached)][:3]
    return report


# ---- side-by-side decoding speed: several engines, interleaved, one process ------------------
def compare_engines(engines: dict, sources: Sequence[str], *, repeats: int = 3,
                    references: Optional[Sequence[str]] = None) -> dict:
    """Times several `TranslateFn`s on the same sentences, interleaved, and compares their outputs.

    Args:
        engines: name → TranslateFn (sentences → (translations, generated tokens per
            sentence)), tokenization and detokenization included. The first is the
            reference for ratios and identical outputs.
        sources: the sentences, translated whole by each engine every pass.
        repeats: timed passes per engine, after one warm-up (cold) pass each. Pass r of
            every engine runs before pass r + 1 of any, so a change of machine load hits
            all engines alike.
        references: optional reference translations: each engine's corpus BLEU is added.

    Returns:
        A JSON-ready dict: `engines` (name → cold pass, best and median warm pass: seconds,
        sentences/s, generated tokens/s; `ratio` = its best sentences/s ÷ the reference's;
        `identical` = sentences whose translation equals the reference's; `cores_busy` =
        CPU seconds of this process per second of a warm pass, median; `bleu` with
        `references`) and `reference`.
    """
    if not engines:
        raise ValueError("no engine to compare")
    outputs, cold, warm, tokens = {}, {}, {name: [] for name in engines}, {}
    cores = {name: [] for name in engines}  # this process's CPU seconds per wall second of a warm pass
    for name, fn in engines.items():
        outputs[name], tokens[name], cold[name] = timed_pass(fn, sources)
    for _ in range(repeats):
        for name, fn in engines.items():
            cpu = time.process_time()
            again, _, seconds = timed_pass(fn, sources)
            cores[name].append((time.process_time() - cpu) / seconds)
            if again != outputs[name]:
                raise RuntimeError(f"{name}: translations changed between passes over the same input")
            warm[name].append(seconds)
    reference = next(iter(engines))
    results = {}
    for name in engines:
        best = min(warm[name]) if warm[name] else cold[name]
        median = float(np.median(warm[name])) if warm[name] else cold[name]
        same = sum(a == b for a, b in zip(outputs[name], outputs[reference]))
        results[name] = {
            "best": speed(len(sources), tokens[name], best),
            "median": speed(len(sources), tokens[name], median),
            "cold": speed(len(sources), tokens[name], cold[name]),
            "warm_pass_seconds": [round(s, 3) for s in warm[name]],
            "cores_busy": round(float(np.median(cores[name])), 2) if cores[name] else None,
            "identical": same,
        }
        if references is not None:
            results[name]["bleu"] = score(outputs[name], references)["bleu"]
    base = results[reference]["best"]["sentences_per_s"]
    for name, result in results.items():
        result["ratio"] = round(result["best"]["sentences_per_s"] / base, 2)
        result["ratio_median"] = round(result["median"]["sentences_per_s"] / results[reference]["median"]["sentences_per_s"], 2)
    return {"reference": reference, "num_sentences": len(sources), "repeats": repeats, "engines": results,
            "examples": [{"source": s, **{name: outputs[name][i] for name in engines}}
                         for i, s in enumerate(sources[:3])]}


def comparison_table(comparison: dict) -> str:
    """Markdown table of `compare_engines`' result."""
    lines = ["| engine | sentences/s (best) | median | generated tokens/s | ratio | cores busy | outputs identical | BLEU |",
             "|---|---|---|---|---|---|---|---|"]
    n = comparison["num_sentences"]
    for name, r in comparison["engines"].items():
        bleu = f"{r['bleu']:.2f}" if "bleu" in r else "—"
        lines.append(f"| {name} | {r['best']['sentences_per_s']:.1f} | {r['median']['sentences_per_s']:.1f} | "
                     f"{r['best']['tokens_per_s'] or 0:,.0f} | {r['ratio']:.2f}× | {r.get('cores_busy') or 0:.2f} | "
                     f"{r['identical']}/{n} | {bleu} |")
    return "\n".join(lines)
