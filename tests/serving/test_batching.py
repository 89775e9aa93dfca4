"""Dynamic batching without a model: runs of similar length, the oldest sentence first, every
request answered with its own translations in order (a fake `translate` records the calls);
step-level batching over a fake engine whose rows end after as many steps as they have characters."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from transformer.serving.batching import LENGTH_OFFSET, DynamicBatcher, StepBatcher, split_by_length, split_for_idle


def cost(lengths, ends, overhead):
    starts = [0] + ends[:-1]
    return sum((lengths[e - 1] + LENGTH_OFFSET) * (e - s + overhead) for s, e in zip(starts, ends))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=9), st.integers(1, 5), st.sampled_from([0.0, 3.0, 50.0]))
def test_split_by_length_is_the_cheapest_split_into_runs_of_at_most_max_batch(lengths, max_batch, overhead):
    lengths = sorted(lengths)
    ends = split_by_length(lengths, max_batch, overhead)
    assert ends[-1] == len(lengths) and ends == sorted(set(ends))
    assert all(e - s <= max_batch for s, e in zip([0] + ends[:-1], ends))
    inner = range(1, len(lengths))
    every_split = ([*cuts, len(lengths)] for r in range(len(lengths)) for cuts in itertools.combinations(inner, r))
    legal = [e for e in every_split if all(b - a <= max_batch for a, b in zip([0] + e[:-1], e))]
    assert cost(lengths, ends, overhead) <= min(cost(lengths, e, overhead) for e in legal) + 1e-9


def test_split_by_length_keeps_a_uniform_batch_whole_and_cuts_off_a_long_tail():
    assert split_by_length([10] * 8, 8) == [8]
    assert split_by_length([10] * 7 + [400], 8) == [7, 8]


def test_waiting_sentences_are_decoded_in_runs_of_similar_length_and_each_request_gets_its_own():
    calls, gate = [], threading.Event()

    def translate(texts):
        gate.wait()
        calls.append(list(texts))
        return [t.upper() for t in texts]

    batcher = DynamicBatcher(translate, max_batch=8, max_wait_ms=0).start()
    batcher.ready.wait()

    async def clients():
        first = asyncio.ensure_future(batcher.translate(["a" * 5]))  # decoded alone while the others queue
        await asyncio.sleep(0.05)
        requests = [["b" * 300, "c" * 3], ["d" * 4, "e" * 290, "f" * 6], ["g" * 5, "h" * 310]]
        rest = [asyncio.ensure_future(batcher.translate(texts)) for texts in requests]
        await asyncio.sleep(0.05)
        gate.set()
        return await first, await asyncio.gather(*rest), requests

    first, answers, requests = asyncio.run(clients())
    batcher.stop()
    assert first == ["AAAAA"]
    assert answers == [[t.upper() for t in texts] for texts in requests]
    # The queued sentences, sorted by length, split into a short run and a long one; the run
    # holding the oldest waiting sentence ("b" * 300) goes first.
    assert calls[0] == ["a" * 5] and calls[1:] == [["b" * 300, "e" * 290, "h" * 310], ["c" * 3, "d" * 4, "f" * 6, "g" * 5]]
    assert batcher.queued == 0 and batcher.stats["batches"] == 3 and batcher.stats["answered"] == 4


def test_decoder_streams_decode_runs_at_once_and_each_request_gets_its_own():
    running, most, lock, gate = [0], [0], threading.Lock(), threading.Event()

    def translate(texts):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(5)  # both streams take a run before either finishes
        with lock:
            running[0] -= 1
        return [t.upper() for t in texts]

    batcher = DynamicBatcher(translate, max_batch=2, max_wait_ms=0, streams=2).start()
    batcher.ready.wait()

    async def clients():
        requests = [["a", "bb"], ["ccc", "dddd"], ["eeeee", "f"], ["gggggg"]]
        futures = [asyncio.ensure_future(batcher.translate(texts)) for texts in requests]
        await asyncio.sleep(0.2)
        gate.set()
        return requests, await asyncio.gather(*futures)

    requests, answers = asyncio.run(clients())
    batcher.stop()
    assert most[0] == 2 and len(batcher._threads) == 2  # two runs of at most 2 sentences were decoding at once
    assert answers == [[t.upper() for t in texts] for texts in requests]
    assert batcher.stats["batches"] == 4 and batcher.queued == 0 and not any(thread.is_alive() for thread in batcher._threads)


def test_split_for_idle_cuts_only_where_two_runs_at_once_end_sooner():
    assert split_for_idle([50] * 20) == 10  # 2 × (10 + 29) rows' steps at once against 20 + 29
    assert split_for_idle([50] * 3) == 0  # the fixed part paid twice: no shorter
    assert split_for_idle([5] * 10 + [100] * 2) == 10  # the short ones leave the long ones' steps
    assert split_for_idle([]) == 0 and split_for_idle([7]) == 0


def test_a_run_is_shared_with_an_idle_decoding_thread():
    running, most, lock, gate, calls = [0], [0], threading.Lock(), threading.Event(), []

    def translate(texts):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            calls.append(len(texts))
        gate.wait(5)  # the second thread takes its part before the first finishes
        with lock:
            running[0] -= 1
        return [t.upper() for t in texts]

    batcher = DynamicBatcher(translate, max_batch=64, max_wait_ms=50, streams=2).start()
    batcher.ready.wait()
    texts = [f"{k:03d}" + "x" * 40 for k in range(40)]

    async def client():
        future = asyncio.ensure_future(batcher.translate(texts))
        await asyncio.sleep(0.3)
        gate.set()
        return await future

    answer = asyncio.run(client())
    batcher.stop()
    assert answer == [t.upper() for t in texts]  # in order, whichever thread decoded which part
    assert most[0] == 2 and sorted(calls) == [20, 20] and batcher.stats["split_runs"] == 1
    assert batcher.queued == 0


class CountingEngine:
    """A step engine: a row of text t ends after len(t) steps (at least one) and translates to t.upper()."""

    steps_per_call = 1

    def __init__(self, fail_on=None):
        self.rows, self.step_rows, self.added, self.fail_on = {}, [], [], fail_on
        self.steps = self.row_steps = 0
        self.gate = threading.Event()
        self.gate.set()

    @property
    def active(self):
        return len(self.rows)

    def add(self, texts, keys):
        self.added.append(list(texts))
        for text, key in zip(texts, keys):
            self.rows[key] = [text, max(len(text), 1)]

    def step(self):
        self.gate.wait()
        self.step_rows.append(sorted(text for text, _ in self.rows.values()))
        self.steps, self.row_steps = self.steps + 1, self.row_steps + len(self.rows)
        if self.fail_on is not None and any(text == self.fail_on for text, _ in self.rows.values()):
            raise RuntimeError("the model failed")
        done = []
        for key, row in list(self.rows.items()):
            row[1] -= 1
            if row[1] == 0:
                done.append((key, self.rows.pop(key)[0].upper()))
        return done

    def reset(self):
        self.rows.clear()

    def translate(self, texts):
        return [t.upper() for t in texts]


def test_sentences_join_a_running_decode_between_steps_and_leave_when_they_end():
    engine = CountingEngine()
    batcher = StepBatcher([engine], max_batch=3, max_wait_ms=0)
    batcher.join_every = 1  # waiting sentences join at every step
    batcher.start().ready.wait()
    engine.gate.clear()  # hold the first step until the others have queued

    async def clients():
        first = asyncio.ensure_future(batcher.translate(["a" * 6]))  # decoding while the others arrive
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(batcher.translate(texts)) for texts in (["bb", "c"], ["dddd", "e"])]
        await asyncio.sleep(0.05)
        engine.gate.set()
        return await first, await asyncio.gather(*rest)

    first, rest = asyncio.run(clients())
    batcher.stop()
    assert first == ["AAAAAA"] and rest == [["BB", "C"], ["DDDD", "E"]]
    # At most max_batch rows; "aaaaaa" kept decoding while the others joined (one step after they
    # came, as rows left) and left, each after its own number of steps: a run-based batcher
    # would hold "c" until "bb" ended and "dddd" until "aaaaaa" ended.
    a, d = "a" * 6, "dddd"
    assert engine.step_rows == [[a], [a, "bb", "c"], [a, "bb", d], [a, d, "e"], [a, d], [a, d]]
    assert engine.added == [[a], ["bb", "c"], [d], ["e"]]
    assert batcher.queued == 0 and batcher.stats["answered"] == 3 and batcher.stats["steps"] == 6


def test_a_failing_step_fails_the_requests_in_the_engine_and_the_batcher_keeps_serving():
    batcher = StepBatcher([CountingEngine(fail_on="boom")], max_batch=8, max_wait_ms=0).start()
    batcher.ready.wait()

    async def clients():
        results = await asyncio.gather(batcher.translate(["boom", "x"]), return_exceptions=True)
        return results[0], await batcher.translate(["ok"])

    failed, ok = asyncio.run(clients())
    batcher.stop()
    assert isinstance(failed, RuntimeError) and ok == ["OK"] and batcher.queued == 0


class SlowEngine(CountingEngine):
    """A step takes 2 ms with the GIL released, as a TensorFlow call does."""

    def step(self):
        time.sleep(0.002)
        return super().step()


def test_two_engines_share_the_waiting_sentences_and_a_busy_one_never_waits_for_the_other():
    engines = [SlowEngine(), SlowEngine()]
    batcher = StepBatcher(engines, max_batch=8, max_wait_ms=0)
    batcher.start().ready.wait()
    texts = [f"{k:02d}" + "y" * (k % 5) for k in range(24)]

    async def clients():
        return await asyncio.gather(*(batcher.translate(texts[k:k + 3]) for k in range(0, len(texts), 3)))

    answers = asyncio.run(clients())
    assert [t for answer in answers for t in answer] == [t.upper() for t in texts]  # each its own, in order
    assert all(engine.added for engine in engines)  # both engines decoded
    assert max(len(rows) for engine in engines for rows in engine.step_rows) <= 8
    # One request alone: one engine decodes it while the other, idle, waits for work holding the
    # planning lock; the busy one must not wait for that lock (it would wait forever here).
    slow = asyncio.run(asyncio.wait_for(batcher.translate(["z" * 50]), 10))
    batcher.stop()
    assert slow == ["Z" * 50] and batcher.queued == 0
