"""Dynamic batching: requests from many clients decoded together on one thread.

    batcher = DynamicBatcher(translate, max_batch=32, max_wait_ms=5, max_queue=1024)
    batcher.start(warmup=["Olá."])                # the decoding thread; warms up, then ready
    await batcher.translate(["olá", "bom dia"], timeout_s=30)   # from the event loop

The decoding thread takes the oldest request, then gathers more until the batch holds
`max_batch` sentences or `max_wait_ms` have passed since that request arrived, makes one
`translate` call and hands each request its own slice, in order. A request larger than
`max_batch` is decoded alone, in slices of `max_batch`. The event loop only waits on futures:
it never runs TensorFlow. No TensorFlow here: `translate` is any list-of-str → list-of-str.
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


@dataclass(eq=False)
class _Job:
    texts: list
    done: Callable[[Optional[list], Optional[BaseException]], None]
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False


class DynamicBatcher:
    """One decoding thread fed by a bounded queue of requests.

    Args:
        translate: callable, list of str (or bytes) → list of str of the same length.
        max_batch: int. Most sentences per `translate` call. Defaults to 32.
        max_wait_ms: float. Longest a request waits for others to join its batch. Defaults to 5.
        max_queue: int. Most sentences accepted and not yet answered; beyond it `QueueFull`.
    """

    def __init__(self, translate: Callable[[list], list], max_batch: int = 32, max_wait_ms: float = 5.0,
                 max_queue: int = 1024):
        if max_batch < 1 or max_queue < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch and max_queue must be >= 1 and max_wait_ms >= 0, got "
                             f"{max_batch}, {max_queue}, {max_wait_ms}")
        self._translate = translate
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_ms / 1000.0, max_queue
        self._jobs: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
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
            batch = self._gather()
            if batch is None:
                return
            self._decode(batch)

    def _gather(self) -> Optional[list[_Job]]:
        with self._cond:
            while not self._jobs:
                if self._stopping:
                    return None
                self._cond.wait()
            first = self._jobs.popleft()
            batch, size = [first], len(first.texts)
            deadline = first.arrived + self.max_wait_s
            while size < self.max_batch:
                if self._jobs:
                    if size + len(self._jobs[0].texts) > self.max_batch:
                        break
                    job = self._jobs.popleft()
                    batch.append(job)
                    size += len(job.texts)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping:
                    break
                self._cond.wait(remaining)
        return batch

    def _decode(self, batch: list[_Job]) -> None:
        live = [job for job in batch if not job.cancelled]
        texts = [text for job in live for text in job.texts]
        error, translations = None, []
        started = time.perf_counter()
        try:
            for i in range(0, len(texts), self.max_batch):
                translations.extend(self._translate(texts[i:i + self.max_batch]))
            if len(translations) != len(texts):
                raise RuntimeError(f"the model returned {len(translations)} translations for {len(texts)} sentences")
        except Exception as err:  # every request of the batch gets the error (HTTP 500)
            error = err
        elapsed = time.perf_counter() - started
        with self._cond:
            self._pending -= sum(len(job.texts) for job in batch)
            if texts:
                self.stats["batches"] += 1
                self.stats["sentences"] += len(texts)
                self.stats["decode_s"] += elapsed
            self.stats["answered"] += len(live)
        start = 0
        for job in live:
            end = start + len(job.texts)
            job.done(None if error is not None else translations[start:end], error)
            start = end
