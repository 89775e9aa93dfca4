"""Dynamic batching: sentences from many clients decoded together.

    batcher = StepBatcher([engine, engine2], max_batch=128, max_wait_ms=5, max_queue=1024)   # step-level
    batcher = DynamicBatcher(translate, max_batch=128, max_wait_ms=5, streams=2)   # whole runs
    batcher.start(warmup=["Olá."])                # the decoding thread; warms up, then ready
    await batcher.translate(["olá", "bom dia"], timeout_s=30)   # from the event loop

`StepBatcher` (`--batching step`, greedy models without XLA) drives step engines
(`transformer.inference.stepping.ContinuousDecoder`), one thread each: waiting sentences join a
running decode between steps and each leaves when it ends, so no sentence waits for a longer
one or for a batch to finish (see the class).

`DynamicBatcher` decodes whole runs with one `translate` call each, `streams` calls at once
(one decoding thread each: a decoder step of a small run is bound by its many small kernels,
so two calls overlap on a few cores). Greedy decoding of a
batch runs until its longest sentence ends, every row paying each step, so in a batch of mixed
lengths the short sentences pay for the long one: offline, the translator sorts a file by
length first. Each decoding thread does the same with what is waiting (continuous batching of
queued sentences); one plans at a time. Each turn it
  1. waits for company: until `max_batch` sentences wait or `max_wait_ms` have passed since
     the oldest waiting request arrived or, if later, since the last run was answered (its
     clients' next requests arrive within milliseconds, and join this turn);
  2. sorts every waiting sentence (of any request) by length and splits them into runs of
     similar length (`split_by_length`: at most `max_batch`, minimising the estimated cost);
  3. decodes the run holding the oldest sentence (so none waits forever), in one `translate`
     call, and answers every request whose sentences are all translated, in order. When
     another decoding thread is idle, the run is first cut in two by length where that
     shortens it (`split_for_idle`): this thread decodes the part holding the oldest sentence
     and the idle one takes the other at once, each on its own core.
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
# 2-core Xeon (amx_bf16), 2026-11-24, float32 export of the default recipe with the lean step,
# one export call on N copies of a 38-step sentence: 3.95 ms per step for 8 rows, 5.47 for 25,
# 6.96 for 40, 9.34 for 64, 16.65 for 128 (≈ 3.1 + 0.106 × rows). (The step before the lean
# one: 2.8 + 0.19 × rows, 15 rows.)
STEP_OVERHEAD_ROWS = 29.0
# While the engine decodes, waiting sentences join every this many steps: a join (tokenize,
# encode, grow the batch) costs about one step, so joining every step for the one or two
# sentences that arrived spends a tenth of the time on joins. Measured (Xeon amx_bf16,
# 2026-11-24, 16 clients, float32 export of the default recipe): every 1 / 3 / 6 steps 0.49 /
# 0.54 / 0.56 of the offline figure, p95 1.01 / 0.94 / 0.91 s.
JOIN_EVERY_STEPS = 4
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


def split_for_idle(lengths: Sequence[int], overhead_rows: float = STEP_OVERHEAD_ROWS, gain: float = 0.9) -> int:
    """Where to cut one run of ascending `lengths` into two decoded at once on two threads (0: keep it whole).

    A run costs its longest length × (its rows + `overhead_rows`) (as `split_by_length`); two
    runs at once take the longer of the two. The cut minimising that is taken when it is at most
    `gain` × the whole run's cost: a step's fixed part is paid twice, so small runs stay whole.
    """
    n = len(lengths)
    whole = (lengths[-1] + LENGTH_OFFSET) * (n + overhead_rows) if n else 0.0
    best, cut = whole, 0
    for k in range(1, n):
        cost = max((lengths[k - 1] + LENGTH_OFFSET) * (k + overhead_rows),
                   (lengths[-1] + LENGTH_OFFSET) * (n - k + overhead_rows))
        if cost < best:
            best, cut = cost, k
    return cut if best <= gain * whole else 0


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
    """`streams` decoding threads fed by a bounded queue of requests.

    Args:
        translate: callable, list of str (or bytes) → list of str of the same length; called
            from `streams` threads at once.
        max_batch: int. Most sentences per `translate` call (a run). Defaults to 32.
        max_wait_ms: float. Longest a turn waits for more sentences (see the module). Defaults to 5.
        max_queue: int. Most sentences accepted and not yet answered; beyond it `QueueFull`.
        streams: int. `translate` calls running at once. Defaults to 1.
    """

    mode = "run"

    def __init__(self, translate: Callable[[list], list], max_batch: int = 32, max_wait_ms: float = 5.0,
                 max_queue: int = 1024, streams: int = 1):
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0 or streams < 1:
            raise ValueError(f"max_batch, max_queue and streams must be >= 1 and max_wait_ms >= 0, got "
                             f"{max_batch}, {max_queue}, {streams}, {max_wait_ms}")
        self._translate = translate
        self.streams = streams
        self._planning = threading.Lock()  # one decoding thread gathers and plans at a time
        self.overhead_rows = STEP_OVERHEAD_ROWS
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self._jobs: collections.deque[_Job] = collections.deque()  # submitted, not yet in the pool
        self._pool: list[tuple[_Job, int]] = []  # (job, index) of sentences waiting, oldest first
        self._cond = threading.Condition()
        self._last_run_end = 0.0  # time.monotonic() when the last run was answered
        self._decoding = 0  # threads with a run planned or being decoded
        self._pending = 0  # sentences accepted and not yet answered (queued or being decoded)
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.ready = threading.Event()
        self.warmup_error: Optional[BaseException] = None
        self.stats = {"requests": 0, "sentences": 0, "answered": 0, "batches": 0, "decode_s": 0.0, "rejected": 0, "timed_out": 0,
                      "split_runs": 0}

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, warmup: Sequence[str] = ()) -> "DynamicBatcher":
        """Starts the first decoding thread; it translates `warmup`, starts the others, then sets `ready`."""
        self._threads = [threading.Thread(target=self._run, args=(list(warmup),), name="decoder", daemon=True)]
        self._threads[0].start()
        return self

    def stop(self, timeout_s: Optional[float] = None) -> None:
        """Refuses new requests, answers every accepted one, then ends the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in list(self._threads):  # the first thread adds the others before `ready`
            thread.join(timeout_s)

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
        for k in range(1, self.streams):
            self._threads.append(threading.Thread(target=self._loop, name=f"decoder-{k}", daemon=True))
            self._threads[-1].start()
        self.ready.set()
        self._loop()

    def _loop(self) -> None:
        """One decoding thread's turns, until stopped with nothing left."""
        while True:
            with self._planning:
                run = self._next_run()
            if run is None:
                return
            if run:
                self._decode(run)

    def _gather(self, busy: int = 0, after: float = 0.0) -> bool:
        """Waits for sentences, then moves every submitted one into the pool (dropping timed-out
        requests); False once stopping with nothing left. Until `max_batch` sentences wait (with
        `busy` already being decoded), it waits at most `max_wait_s` after the oldest arrived or,
        if later, after `after`; with `busy` rows it does not wait at all."""
        with self._cond:
            while not self._jobs and not self._pool and not busy:
                if self._stopping:
                    return False
                self._cond.wait()
            if not busy and (self._jobs or self._pool):
                oldest = self._pool[0][0] if self._pool else self._jobs[0]
                deadline = max(oldest.arrived, after) + self.max_wait_s
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
        # The pool belongs to the thread planning (it holds `_planning`): no other lock needed.
        self._pool = [(job, i) for job, i in self._pool if not job.finished]
        return True

    def _next_run(self) -> Optional[list[tuple[_Job, int]]]:
        """The next sentences to decode together ([] if every waiting one was cancelled; None: stop)."""
        # Also wait after a run: its clients' next requests come back within milliseconds.
        if not self._gather(after=self._last_run_end):
            return None
        if not self._pool:
            return []
        window = self._pool[:4 * self.max_batch]  # bounds the planning work
        order = sorted(range(len(window)), key=lambda k: self._length(window[k]))
        lengths = [self._length(window[k]) for k in order]  # ascending
        ends = split_by_length(lengths, self.max_batch, self.overhead_rows)
        start = 0
        for end in ends:  # the run holding the oldest sentence, window[0]
            if 0 in order[start:end]:
                break
            start = end
        members = order[start:end]  # ascending length
        with self._cond:
            idle = self.streams - 1 - self._decoding  # other threads not decoding: waiting to plan
        if idle > 0:
            cut = split_for_idle(lengths[start:end], self.overhead_rows)
            if cut:  # this thread takes the part holding the oldest; the rest waits for an idle one
                members = members[:cut] if 0 in members[:cut] else members[cut:]
                self.stats["split_runs"] += 1
        chosen = set(members)
        run = [window[k] for k in sorted(chosen)]
        self._pool = [item for k, item in enumerate(window) if k not in chosen] + self._pool[len(window):]
        with self._cond:
            self._decoding += 1  # claimed before the next thread plans; `_decode` releases it
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
        error, translations = None, []
        started = time.perf_counter()
        try:
            translations = self._translate(texts)
            if len(translations) != len(texts):
                raise RuntimeError(f"the model returned {len(translations)} translations for {len(texts)} sentences")
        except Exception as err:  # every request of the run gets the error (HTTP 500)
            error = err
        with self._cond:
            self._decoding -= 1
            self.stats["batches"] += 1
            self.stats["decode_s"] += time.perf_counter() - started
        self._answer(run, translations, error)
        self._last_run_end = time.monotonic()

    def _answer(self, items: list[tuple[_Job, int]], translations: list, error: Optional[BaseException] = None) -> None:
        """Stores the translations of `items` ((job, index) each) and answers every request now
        complete; with `error`, every request of `items` gets it instead."""
        answers = []
        with self._cond:
            self.stats["sentences"] += len(items)
            for k, (job, i) in enumerate(items):
                if job.finished:  # failed earlier, or timed out and dropped
                    continue
                if error is None:
                    job.translations[i] = translations[k]
                    job.left -= 1
                if error is not None or job.left == 0:
                    self._finish(job)
                    if not job.cancelled:
                        self.stats["answered"] += 1
                    answers.append(job)
        for job in answers:  # a failed job's sentences still waiting leave the pool at the next gather
            job.done(None if error is not None else job.translations, error)


class StepBatcher(DynamicBatcher):
    """Step-level continuous batching: sentences join a running decode between its steps.

    Each engine decodes up to `steps_per_call` tokens for each of its active rows per `step` (e.g.
    `transformer.inference.stepping.ContinuousDecoder`), driven by a thread of its own. A thread
    loops: move waiting sentences into its engine (oldest first, up to `max_batch` rows), call
    `step`, answer every request whose sentences have all finished. While its engine has rows,
    waiting sentences join every `JOIN_EVERY_STEPS` steps (or every call, if it decodes as many);
    when it is idle, the first sentences wait as in `DynamicBatcher` (until `max_batch` sentences
    or `max_wait_ms` after the oldest arrived). A row costs only its own steps: it leaves as
    soon as it ends, and a new sentence starts at the next step instead of after the longest
    row of a batch.

    With several engines (one per core: a small batch's step is bound by its kernels' fixed
    cost, so two batches of N rows on two threads take about the time of one), the waiting
    sentences are shared so that the engines hold about as many rows each: a thread joining
    takes up to `ceil((waiting + rows of every engine) / engines)` minus its own rows. One
    thread gathers at a time; a thread with rows never waits for another's gathering (it
    steps and joins at a later turn).

    Args:
        engines: the engines, one decoding thread each. An engine has
            `add(texts, keys)`, `step() → [(key, translation)]` of the rows that ended (up to
            `steps_per_call` tokens per row), `steps` and `row_steps` (counters of steps and
            rows over them), `active` (rows being decoded), `reset()` (drop every row) and
            `translate(texts)` (warm-up).
        max_batch, max_wait_ms, max_queue: as in `DynamicBatcher`; `max_batch` bounds each engine's rows.
    """

    mode = "step"

    def __init__(self, engines: Sequence, max_batch: int = 32, max_wait_ms: float = 5.0, max_queue: int = 1024):
        if not engines:
            raise ValueError("StepBatcher needs at least one engine")
        super().__init__(engines[0].translate, max_batch, max_wait_ms, max_queue, streams=len(engines))
        self._engines = list(engines)
        # Per engine: key → (job, index) of every sentence in it. Written by its own thread, under
        # `_planning` when sentences join; the others read their sizes to share the waiting ones.
        self._rows: list[dict] = [{} for _ in engines]
        self._keys = 0  # the next row's key
        self.join_every = JOIN_EVERY_STEPS
        self.stats.update(steps=0, row_steps=0)

    def _run(self, warmup: list) -> None:
        for engine in self._engines:
            try:
                if warmup:
                    engine.translate(warmup)
            except Exception as err:  # the server reports it on /health
                self.warmup_error = err
                engine.reset()
        for k in range(1, len(self._engines)):
            self._threads.append(threading.Thread(target=self._drive, args=(k,), name=f"decoder-{k}", daemon=True))
            self._threads[-1].start()
        self.ready.set()
        self._drive(0)

    def _take(self, k: int) -> tuple[list[tuple[_Job, int]], list[int]]:
        """(sentences, keys) engine `k` takes now (under `_planning`), registered in its rows: at most
        `max_batch` rows in all, and its share of every engine's rows and the waiting ones."""
        rows = self._rows[k]
        room = self.max_batch - len(rows)
        if len(self._engines) > 1:
            total = len(self._pool) + sum(len(r) for r in self._rows)
            room = max(0, min(room, -(-total // len(self._engines)) - len(rows)))
        joining, self._pool = self._pool[:room], self._pool[room:]
        keys = list(range(self._keys, self._keys + len(joining)))  # unique: one planner at a time
        self._keys += len(joining)
        rows.update(zip(keys, joining))
        return joining, keys

    def _drive(self, k: int) -> None:
        """Engine `k`'s thread: join, step, answer, until stopped with nothing left."""
        engine, rows = self._engines[k], self._rows[k]
        since_join = 0  # steps since sentences last joined
        while True:
            since_join += engine.steps_per_call
            joining = []
            # An engine with rows does not wait for another thread's gathering: it steps meanwhile.
            if self._planning.acquire(blocking=not rows):
                try:
                    if not self._gather(busy=len(rows)):
                        return
                    if not rows or since_join >= self.join_every:
                        joining, keys = self._take(k)
                finally:
                    self._planning.release()
            since_join = 0 if joining else since_join
            started = time.perf_counter()
            try:
                if joining:
                    engine.add([job.texts[i] for job, i in joining], keys)
                    with self._cond:
                        self.stats["batches"] += 1
                steps, row_steps = engine.steps, engine.row_steps
                finished = engine.step() if rows else []
            except Exception as err:  # every sentence in the engine gets the error (HTTP 500)
                engine.reset()
                failed = list(rows.values())  # the joining ones too
                rows.clear()
                self._answer(failed, [], err)
                continue
            answered = [rows.pop(key) for key, _ in finished]
            with self._cond:
                self.stats["decode_s"] += time.perf_counter() - started
                self.stats["steps"] += engine.steps - steps
                self.stats["row_steps"] += engine.row_steps - row_steps
            if finished:
                self._answer(answered, [text for _, text in finished])
