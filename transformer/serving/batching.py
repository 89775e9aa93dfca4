"""Dynamic batching: sentences from many clients decoded together on one thread.

    batcher = DynamicBatcher(translate, max_batch=128, max_wait_ms=5, max_queue=1024)
    batcher.start(warmup=["Olá."])                # the decoding thread; warms up, then ready
    await batcher.translate(["olá", "bom dia"], timeout_s=30)   # from the event loop

Greedy decoding of a batch runs until its longest sentence ends, every row paying each step,
so in a batch of mixed lengths the short sentences pay for the long one: offline, the
translator sorts a file by length first. The decoding thread does the same with what is
waiting (continuous batching of queued sentences, not of decoder steps). Each turn it
  1. waits for company: until `max_batch` sentences wait or `max_wait_ms` have passed since
     the oldest waiting request arrived or, if later, since the last run was answered (its
     clients' next requests arrive within milliseconds, and join this turn);
  2. sorts every waiting sentence (of any request) by length and splits them into runs of
     similar length (`split_by_length`: at most `max_batch`, minimising the estimated cost);
  3. decodes the run holding the oldest sentence (so none waits forever), in one `translate`
     call, and answers every request whose sentences are all translated, in order.
Requests arriving meanwhile join the waiting sentences of the next turn. The event loop only
waits on futures: it never runs TensorFlow. No TensorFlow here: `translate` is any list of str
(or bytes) → list of str; the length of a sentence is its number of characters (or bytes).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence


class QueueFull(Exception):
    """More sentences are waiting than `max_queue`: the caller should retry later (HTTP 503)."""


class Stopped(Exception):
    """The batcher is stopping and accepts no new request."""


# Per decoder step, a batch costs about (rows + STEP_OVERHEAD_ROWS) rows' work: measured on the
# 2-core Xeon (amx_bf16), 2026-11-24, float32 export of the default recipe, one 21-step sentence
# repeated: 3.1 ms per step for 1 row, 6.5 for 16, 14.9 for 64, 26.9 for 128 (≈ 2.8 + 0.19 × rows).
STEP_OVERHEAD_ROWS = 15.0
LENGTH_OFFSET = 8  # characters standing for [END] and the decoder's fixed steps


def split_by_length(lengths: Sequence[int], max_batch: int, overhead_rows: float = STEP_OVERHEAD_ROWS) -> list[int]:
    """Where to cut ascending `lengths` into runs of at most `max_batch`.

    A run costs its longest length × (its rows + `overhead_rows`): greedy decoding runs every
    row until the longest ends. Exact minimum by dynamic programming, O(len × max_batch).

    Returns:
        The run ends, ascending, the last being `len(lengths)`: run k is `[ends[k-1], ends[k])`.
    """
    n = len(lengths)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for end in range(1, n + 1):
        longest = lengths[end - 1] + LENGTH_OFFSET
        for start in range(max(0, end - max_batch), end):
            cost = best[start] + longest * (end - start + overhead_rows)
            if cost < best[end]:
                best[end], cut[end] = cost, start
    ends, end = [], n
    while end > 0:
        ends.append(end)
        end = cut[end]
    return ends[::-1]


@dataclass(eq=False)
class _Job:
    texts: list
    done: Callable[[Optional[list], Optional[BaseException]], None]
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    translations: list = field(default_factory=list)
    left: int = 0  # sentences not yet translated
    finished: bool = False

    def __post_init__(self):
        self.translations = [None] * len(self.texts)
        self.left = len(self.texts)


class DynamicBatcher:
    """One decoding thread fed by a bounded queue of requests.

    Args:
        translate: callable, list of str (or bytes) → list of str of the same length.
        max_batch: int. Most sentences per `translate` call (a run). Defaults to 32.
        max_wait_ms: float. Longest a turn waits for more sentences (see the module). Defaults to 5.
        max_queue: int. Most sentences accepted and not yet answered; beyond it `QueueFull`.
    """

    def __init__(self, translate: Callable[[list], list], max_batch: int = 32, max_wait_ms: float = 5.0,
                 max_queue: int = 1024):
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch and max_queue must be >= 1 and max_wait_ms >= 0, got "
                             f"{max_batch}, {max_queue}, {max_wait_ms}")
        self._translate = translate
        self.overhead_rows = STEP_OVERHEAD_ROWS
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self._jobs: collections.deque[_Job] = collections.deque()  # submitted, not yet in the pool
        self._pool: list[tuple[_Job, int]] = []  # (job, index) of sentences waiting, oldest first
        self._cond = threading.Condition()
        self._last_run_end = 0.0  # time.monotonic() when the last run was answered
        self._pending = 0  # sentences accepted and not yet answered (queued or being decoded)
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self.ready = threading.Event()
        self.warmup_error: Optional[BaseException] = None
        self.stats = {"requests": 0, "sentences": 0, "answered": 0, "batches": 0, "decode_s": 0.0, "rejected": 0, "timed_out": 0}

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, warmup: Sequence[str] = ()) -> "DynamicBatcher":
        """Starts the decoding thread; it translates `warmup` first, then sets `ready`."""
        self._thread = threading.Thread(target=self._run, args=(list(warmup),), name="decoder", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: Optional[float] = None) -> None:
        """Refuses new requests, answers every accepted one, then ends the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def queued(self) -> int:
        """Sentences accepted and not yet answered."""
        return self._pending

    # ---- requests ------------------------------------------------------------------------
    def submit(self, texts: list, done: Callable[[Optional[list], Optional[BaseException]], None]) -> _Job:
        """Queues `texts`; `done(translations, None)` or `done(None, error)` is called from the decoding thread."""
        with self._cond:
            if self._stopping:
                raise Stopped("the server is shutting down")
            if self._pending + len(texts) > self.max_queue:
                self.stats["rejected"] += 1
                raise QueueFull(f"{self._pending} sentences are waiting (at most {self.max_queue})")
            job = _Job(list(texts), done)
            self._pending += len(texts)
            self.stats["requests"] += 1
            self._jobs.append(job)
            self._cond.notify()
            return job

    async def translate(self, texts: list, timeout_s: Optional[float] = None) -> list[str]:
        """Translations of `texts`, awaited on the running event loop; `asyncio.TimeoutError` after `timeout_s`."""
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(result, error):
            if future.done():  # timed out meanwhile
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        job = self.submit(texts, lambda result, error: loop.call_soon_threadsafe(settle, result, error))
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            job.cancelled = True  # dropped if its batch has not started yet
            self.stats["timed_out"] += 1
            raise

    # ---- the decoding thread ---------------------------------------------------------------
    def _run(self, warmup: list) -> None:
        try:
            if warmup:
                self._translate(warmup)
        except Exception as err:  # the server reports it on /health
            self.warmup_error = err
        self.ready.set()
        while True:
            run = self._next_run()
            if run is None:
                return
            if run:
                self._decode(run)

    def _next_run(self) -> Optional[list[tuple[_Job, int]]]:
        """The next sentences to decode together ([] if every waiting one was cancelled; None: stop)."""
        with self._cond:
            while not self._jobs and not self._pool:
                if self._stopping:
                    return None
                self._cond.wait()
            oldest = self._pool[0][0] if self._pool else self._jobs[0]
            # Also wait after a run: its clients' next requests come back within milliseconds.
            deadline = max(oldest.arrived, self._last_run_end) + self.max_wait_s
            while len(self._pool) + sum(len(job.texts) for job in self._jobs) < self.max_batch and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            while self._jobs:
                job = self._jobs.popleft()
                self._pool += [(job, i) for i in range(len(job.texts))]
            for job in {job for job, _ in self._pool if job.cancelled and not job.finished}:  # timed out: dropped
                self._finish(job)
        # The pool is the decoding thread's own: plan outside the lock.
        self._pool = [(job, i) for job, i in self._pool if not job.finished]
        if not self._pool:
            return []
        window = self._pool[:4 * self.max_batch]  # bounds the planning work
        order = sorted(range(len(window)), key=lambda k: self._length(window[k]))
        ends = split_by_length([self._length(window[k]) for k in order], self.max_batch, self.overhead_rows)
        start = 0
        for end in ends:  # the run holding the oldest sentence, window[0]
            if 0 in order[start:end]:
                break
            start = end
        chosen = set(order[start:end])
        run = [window[k] for k in sorted(chosen)]
        self._pool = [item for k, item in enumerate(window) if k not in chosen] + self._pool[len(window):]
        return run

    @staticmethod
    def _length(item: tuple[_Job, int]) -> int:
        job, i = item
        return len(job.texts[i])

    def _finish(self, job: _Job) -> None:
        """Marks `job` done and releases its place in the queue (under the lock)."""
        job.finished = True
        self._pending -= len(job.texts)

    def _decode(self, run: list[tuple[_Job, int]]) -> None:
        texts = [job.texts[i] for job, i in run]
        error = None
        started = time.perf_counter()
        try:
            translations = self._translate(texts)
            if len(translations) != len(texts):
                raise RuntimeError(f"the model returned {len(translations)} translations for {len(texts)} sentences")
        except Exception as err:  # every request of the run gets the error (HTTP 500)
            error = err
        elapsed = time.perf_counter() - started
        answers = []
        with self._cond:
            self.stats["batches"] += 1
            self.stats["sentences"] += len(texts)
            self.stats["decode_s"] += elapsed
            for k, (job, i) in enumerate(run):
                if job.finished:  # failed earlier in this run
                    continue
                if error is None:
                    job.translations[i] = translations[k]
                    job.left -= 1
                if error is not None or job.left == 0:
                    self._finish(job)
                    if not job.cancelled:
                        self.stats["answered"] += 1
                    answers.append(job)
            if error is not None:
                self._pool = [(job, i) for job, i in self._pool if not job.finished]
        for job in answers:
            job.done(None if error is not None else job.translations, error)
        self._last_run_end = time.monotonic()
