"""Load test: concurrent HTTP clients against the server, compared with offline decoding of the same sentences.

    report = benchmark(model, sentences, concurrency=(1, 4, 16, 64), requests=192)

One list of `requests` requests (1 to `max_texts_per_request` sentences each, drawn with a
fixed seed) is sent at every concurrency level C: C clients, each holding one keep-alive
connection, send their share (requests i, i + C, i + 2C, …) one after another. So every level
translates the same sentences, and one offline figure serves them all: the same model
translating the same sentences as `transformer-translate --file` does (blocks of 1024 lines,
each sorted by source length and decoded in chunks of the model's `chunk_size`, which is also
the server's default `--max-batch`). Each round times the offline run, then every level, back
to back; the report gives, per level, sentences/s (median over rounds) and its ratio to the
same round's offline figure, latency percentiles over every request, failed requests, and
responses that differ from the offline translation of their own input, the decoding thread's
busy fraction and, with step-level batching, decoder steps and rows per step.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
from dataclasses import asdict
from typing import Sequence

from transformer.inference.streaming import translate_blocks
from transformer.serving.app import ServeLimits
from transformer.serving.server import BatchingConfig, ServedModel, ServerThread


def post_json(connection: http.client.HTTPConnection, path: str, payload) -> tuple[int, dict]:
    """(status, decoded JSON body) of one POST on an open connection."""
    body = json.dumps(payload).encode("utf-8")
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"null")


def make_requests(sentences: Sequence[str], requests: int, max_texts_per_request: int, seed: int = 0) -> list[list[str]]:
    """`requests` requests (lists of texts) of 1 to `max_texts_per_request` sentences, drawn with a fixed seed."""
    rng = random.Random(seed)
    return [rng.sample(list(sentences), rng.randint(1, min(max_texts_per_request, len(sentences))))
            for _ in range(requests)]


def share(requests: list, clients: int) -> list[list]:
    """[client][request]: client i sends requests i, i + clients, i + 2 * clients, …"""
    return [requests[i::clients] for i in range(clients)]


def run_clients(url: str, plan: list[list[list[str]]], timeout_s: float = 120.0) -> dict:
    """Sends `plan` ([client][request] → texts) concurrently; per request: status, latency, translations."""
    parsed = urllib.parse.urlsplit(url)
    results: list[list[dict]] = [[] for _ in plan]
    barrier = threading.Barrier(len(plan) + 1)

    def client(index: int):
        connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s)
        barrier.wait()
        for texts in plan[index]:
            started = time.perf_counter()
            try:
                status, body = post_json(connection, "/v1/translate", {"texts": texts})
            except (OSError, http.client.HTTPException, ValueError) as err:
                status, body = 0, {"error": f"{type(err).__name__}: {err}"}
                connection.close()
                connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout_s)
            results[index].append({"texts": texts, "status": status, "latency_s": time.perf_counter() - started,
                                   "body": body})
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(plan))]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return {"wall_s": time.perf_counter() - started, "results": results}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100), linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def offline_run(model: ServedModel, texts: list[str]) -> tuple[float, list[str]]:
    """(sentences/s, translations) of `texts` translated as `transformer-translate --file` does."""
    started = time.perf_counter()
    translations = [t for block in translate_blocks(model.translate, texts) for t in block]
    return len(texts) / (time.perf_counter() - started), translations


def benchmark(model: ServedModel, sentences: Sequence[str], concurrency: Sequence[int] = (1, 4, 16, 64),
              requests: int = 192, max_texts_per_request: int = 4, batching: BatchingConfig = BatchingConfig(),
              limits: ServeLimits = ServeLimits(), rounds: int = 1, seed: int = 0) -> dict:
    """Runs the offline figure and the load test at each level of `concurrency`, `rounds` times
    (a shared machine's load drifts: each ratio compares runs minutes apart at most); returns the report."""
    plan = make_requests(sentences, requests, max_texts_per_request, seed)
    texts = [text for request in plan for text in request]
    model.translate(texts[:64])  # warm-up outside every timing
    offline_rates, levels = [], {c: {"rates": [], "ratios": [], "results": [], "batches": 0, "sentences": 0}
                                 for c in concurrency}
    reference: dict = {}
    with ServerThread(model, batching, limits) as server:
        for _ in range(rounds):
            offline_rate, translations = offline_run(model, texts)
            reference = reference or dict(zip(texts, translations))
            offline_rates.append(offline_rate)
            for clients in concurrency:
                before = dict(server.batcher.stats)
                run = run_clients(server.url, share(plan, clients))
                level, rate = levels[clients], len(texts) / run["wall_s"]
                level["rates"].append(rate)
                level["ratios"].append(rate / offline_rate)
                level["results"] += [r for client in run["results"] for r in client]
                for key in ("batches", "sentences", "steps", "row_steps", "decode_s", "split_runs"):
                    level[key] = level.get(key, 0) + server.batcher.stats.get(key, 0) - before.get(key, 0)
                level["wall_s"] = level.get("wall_s", 0) + run["wall_s"]

    def summary(clients: int, level: dict) -> dict:
        flat = level["results"]
        failed = [r for r in flat if r["status"] != 200]
        wrong = [r for r in flat if r["status"] == 200 and r["body"]["translations"] != [reference[t] for t in r["texts"]]]
        latencies = [r["latency_s"] * 1000 for r in flat]
        return {"clients": clients, "sentences_per_s": percentile(level["rates"], 50),
                "vs_offline": percentile(level["ratios"], 50), "per_round": level["rates"],
                "ratio_per_round": level["ratios"], "requests": len(flat), "failed_requests": len(failed),
                "wrong_translations": len(wrong), "batches": level["batches"], "split_runs": level["split_runs"],
                "mean_batch": level["sentences"] / max(level["batches"], 1),
                "decoder_busy": level["decode_s"] / level["wall_s"],
                "steps": level["steps"], "rows_per_step": level["row_steps"] / level["steps"] if level["steps"] else None,
                "latency_ms": {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95),
                               "p99": percentile(latencies, 99), "max": max(latencies)},
                "errors": sorted({json.dumps(r["body"])[:200] for r in failed})[:5]}

    return {
        "requests": requests, "sentences": len(texts), "max_texts_per_request": max_texts_per_request,
        "rounds": rounds, "batching": {**asdict(batching), "used": server.batcher.mode},
        "limits": asdict(limits), "model": model.info,
        "offline": {"sentences_per_s": percentile(offline_rates, 50), "per_round": offline_rates,
                    "chunk_size": model.info.get("decode", {}).get("chunk_size"),
                    "how": "transformer-translate --file: blocks of 1024 lines, each sorted by source length "
                           "and decoded in chunks of chunk_size"},
        "levels": [summary(clients, levels[clients]) for clients in concurrency],
    }
