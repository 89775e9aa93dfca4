"""Load test: concurrent HTTP clients against the server, compared with offline batched decoding.

    report = benchmark(model, sentences, clients=16, requests_per_client=10)

Each client holds one keep-alive connection and sends its requests one after another (1 to
`max_texts_per_request` sentences each, drawn with a fixed seed). Each round times, back to
back: the same sentences offline in batches of the server's `max_batch` (arrival order), the
clients against the server (sentences/s over the whole run), and the sentences offline in one
call (the translator sorts them all by length). The report gives the medians over rounds and
each round's ratios, latency percentiles over every request, failed requests, and responses
that differ from the offline translation of their own input.
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

from transformer.serving.app import ServeLimits
from transformer.serving.server import BatchingConfig, ServedModel, ServerThread


def post_json(connection: http.client.HTTPConnection, path: str, payload) -> tuple[int, dict]:
    """(status, decoded JSON body) of one POST on an open connection."""
    body = json.dumps(payload).encode("utf-8")
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read() or b"null")


def make_requests(sentences: Sequence[str], clients: int, requests_per_client: int, max_texts_per_request: int,
                  seed: int = 0) -> list[list[list[str]]]:
    """[client][request] → texts: mixed lengths and sizes, drawn with a fixed seed."""
    rng = random.Random(seed)
    return [[rng.sample(list(sentences), rng.randint(1, max_texts_per_request)) for _ in range(requests_per_client)]
            for _ in range(clients)]


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


def offline_throughput(model: ServedModel, texts: list[str], batch: int | None, repeats: int = 2) -> tuple[float, list]:
    """(best sentences/s over `repeats`, translations) of `texts` in batches of `batch` (None: one call)."""
    best, translations = float("inf"), []
    for _ in range(repeats):
        started = time.perf_counter()
        size = batch or len(texts)
        translations = [t for i in range(0, len(texts), size) for t in model.translate(texts[i:i + size])]
        best = min(best, time.perf_counter() - started)
    return len(texts) / best, translations


def benchmark(model: ServedModel, sentences: Sequence[str], clients: int = 16, requests_per_client: int = 10,
              max_texts_per_request: int = 4, batching: BatchingConfig = BatchingConfig(),
              limits: ServeLimits = ServeLimits(), rounds: int = 3, seed: int = 0) -> dict:
    """Runs the load test and the offline baselines, interleaved `rounds` times (a shared machine's
    load drifts: each round's ratio compares runs minutes apart at most); returns the report."""
    plan = make_requests(sentences, clients, requests_per_client, max_texts_per_request, seed)
    texts = [text for requests in plan for request in requests for text in request]
    model.translate(list(sentences[:batching.max_batch]))  # warm-up outside every timing
    per_round, flat, stats = [], [], {}
    reference = None
    with ServerThread(model, batching, limits) as server:
        for _ in range(rounds):
            batched_rate, offline = offline_throughput(model, texts, batching.max_batch, repeats=1)
            reference = reference or dict(zip(texts, offline))
            before = dict(server.batcher.stats)
            run = run_clients(server.url, plan)
            one_call_rate, _ = offline_throughput(model, texts, None, repeats=1)
            batches = server.batcher.stats["batches"] - before["batches"]
            served_rate = len(texts) / run["wall_s"]
            per_round.append({"server_sentences_per_s": served_rate, "offline_batched_sentences_per_s": batched_rate,
                              "offline_one_call_sentences_per_s": one_call_rate, "server_batches": batches,
                              "server_vs_offline_batched": served_rate / batched_rate,
                              "server_vs_offline_one_call": served_rate / one_call_rate})
            flat += [r for client in run["results"] for r in client]
        stats = dict(server.batcher.stats)
    failed = [r for r in flat if r["status"] != 200]
    wrong = [r for r in flat if r["status"] == 200 and r["body"]["translations"] != [reference[t] for t in r["texts"]]]
    latencies = [r["latency_s"] * 1000 for r in flat]

    def median(key):
        return percentile([r[key] for r in per_round], 50)

    return {
        "clients": clients, "requests_per_client": requests_per_client, "rounds": rounds, "requests": len(flat),
        "sentences_per_round": len(texts), "max_texts_per_request": max_texts_per_request,
        "batching": asdict(batching), "limits": asdict(limits), "model": model.info,
        "server": {"sentences_per_s": median("server_sentences_per_s"), "failed_requests": len(failed),
                   "wrong_translations": len(wrong), "batches": stats["batches"],
                   "mean_batch": stats["sentences"] / max(stats["batches"], 1),
                   "latency_ms": {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95),
                                  "p99": percentile(latencies, 99), "max": max(latencies)},
                   "errors": sorted({json.dumps(r["body"])[:200] for r in failed})[:5]},
        "offline": {"batched_sentences_per_s": median("offline_batched_sentences_per_s"), "batch": batching.max_batch,
                    "one_call_sentences_per_s": median("offline_one_call_sentences_per_s")},
        "server_vs_offline_batched": median("server_vs_offline_batched"),
        "server_vs_offline_one_call": median("server_vs_offline_one_call"),
        "per_round": per_round,
    }
