"""Dynamic batching: requests' images wait in a queue and go through the network together, one forward pass for
up to ``max_batch_size`` images gathered within ``max_wait_s`` of the first (Triton's dynamic batcher, TorchServe's
``max_batch_delay``, LitServe's ``batch_timeout``).

The batches are gathered and run by a thread of the batcher's own, not by the event loop: the moment a forward
pass ends, that thread takes the next batch from what queued meanwhile and runs it, while the event loop is still
busy reading requests and writing answers (with the loop gathering, the network waited its turn behind every
request's callbacks: bench/serve.py, 2026-11-29). Answers go back to the loop in one call per batch. A batch waits
only for requests announced as on their way (their bodies being read): a lone request runs at once. A forward pass
that raises fails that batch's images only; the next batch runs. Versions served side by side (a canary, a swap)
take turns through one lock: one forward pass at a time. Bounding the queue is the caller's (``app.py`` admits at
most ``--max-queue`` images), so this holds no more than that. Imports no torch, no Prefect.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A batch's inputs to one result per input, in order; an exception instance as a result fails that input alone.
Forward = Callable[[Sequence[Any]], Sequence[Any]]
BatchDone = Callable[[int, float], None]  # (images in the batch, seconds its forward pass took), in the thread
_STOP = object()


@dataclass
class _Waiting:
    item: Any
    answer: asyncio.Future = field(repr=False)


class Batcher:
    """One model version's queue and the thread that empties it, batch by batch."""

    def __init__(
        self,
        forward: Forward,
        turn: threading.Lock | None = None,
        *,
        max_batch_size: int,
        max_wait_s: float,
        on_batch: BatchDone | None = None,
        name: str = "batcher",
    ) -> None:
        if max_batch_size < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch_size {max_batch_size} must be >= 1 and max_wait_s {max_wait_s} >= 0")
        self.forward, self.turn = forward, turn or threading.Lock()
        self.max_batch_size, self.max_wait_s, self.on_batch = max_batch_size, max_wait_s, on_batch
        self._queue: queue.SimpleQueue[_Waiting | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._coming = 0  # requests announced (bodies being read) whose items are not queued yet
        self._stopped = False

    def start(self) -> None:
        """Start the thread; answers go to the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    def announce(self, count: int = 1) -> None:
        """``count`` requests are on their way (their bodies being read): a gathering batch waits for them, up to
        ``max_wait_s``. With none announced and none queued, a batch runs at once: a lone request pays no wait."""
        self._coming += count

    def withdraw(self, count: int = 1) -> None:
        """Announced requests that arrived (their items enqueued) or will not come."""
        self._coming = max(0, self._coming - count)

    def enqueue(self, item: Any) -> asyncio.Future:
        """Queue ``item`` now; the future gets its result once its batch has run, or the exception its forward pass
        raised (for the whole batch, or for this item alone)."""
        if self._stopped or not self._thread.is_alive():
            raise RuntimeError("the batcher is not running")
        answer = self._loop.create_future()
        self._queue.put(_Waiting(item, answer))
        return answer

    async def submit(self, item: Any) -> Any:
        return await self.enqueue(item)

    async def stop(self) -> None:
        """The thread ends after the batch it runs; items still queued get a RuntimeError."""
        if self._stopped:
            return
        self._stopped = True
        self._queue.put(_STOP)
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)
        left = []
        while not self._queue.empty():
            waiting = self._queue.get_nowait()
            if waiting is not _STOP:
                left.append(waiting)
        self._answer(left, RuntimeError("the batcher stopped before this image ran"))

    def _gather(self) -> list[_Waiting] | None:
        """The next batch (None: stop): the first waiting image, then others until the batch is full,
        ``max_wait_s`` passed, or none is queued and none announced; those already queued join at once."""
        first = self._queue.get()
        if first is _STOP:
            return None
        batch = [first]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            try:
                if not self._queue.empty():
                    waiting = self._queue.get_nowait()
                elif self._coming == 0:  # no other request on its way: waiting would only add latency
                    break
                elif (left := deadline - time.monotonic()) <= 0:
                    break
                else:
                    waiting = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if waiting is _STOP:
                self._queue.put(_STOP)  # this batch runs, then the thread ends
                break
            batch.append(waiting)
        return batch

    def _run(self) -> None:
        while (batch := self._gather()) is not None:
            batch = [waiting for waiting in batch if not waiting.answer.done()]  # a client that left
            if not batch:
                continue
            started = time.perf_counter()
            try:
                with self.turn:
                    results = self.forward([w.item for w in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"the forward pass gave {len(results)} results for {len(batch)} inputs")
            except Exception as error:  # noqa: BLE001 (the batch's requests get it; the batcher goes on)
                results = [error] * len(batch)
            self._answer(batch, results)
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - started)

    def _answer(self, batch: list[_Waiting], results: Sequence[Any] | BaseException) -> None:
        """Hand a batch's results (or one exception for all) to the event loop, in one call."""
        if not batch or self._loop.is_closed():
            return
        if isinstance(results, BaseException):
            results = [results] * len(batch)
        try:
            self._loop.call_soon_threadsafe(_settle, batch, results)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for these
            pass


def _settle(batch: list[_Waiting], results: Sequence[Any]) -> None:
    for waiting, result in zip(batch, results, strict=True):
        if waiting.answer.done():
            continue
        if isinstance(result, BaseException):  # the batch's failure, or this item's own (an image refused)
            waiting.answer.set_exception(result)
        else:
            waiting.answer.set_result(result)
