"""Dynamic batching: requests' images wait in a queue and go through the network together, one forward pass for
up to ``max_batch_size`` images gathered within ``max_wait_s`` of the first (Triton's dynamic batcher, TorchServe's
``max_batch_delay``, LitServe's ``batch_timeout``).

While a batch runs (in the one thread that runs the network, off the event loop), the next one gathers: under load
the queue holds a full batch by the time the network is free, and no time is spent waiting. A batch waits only for
requests announced as on their way (their bodies being read): a lone request runs at once. A forward pass that
raises fails that batch's images only; the next batch runs. Bounding the queue is the caller's (``app.py`` admits
at most ``--max-queue`` images), so this holds no more than that. Imports no torch, no Prefect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

# A batch's inputs to one result per input, in order; an exception instance as a result fails that input alone.
Forward = Callable[[Sequence[Any]], Sequence[Any]]
BatchDone = Callable[[int, float], None]  # (images in the batch, seconds its forward pass took)


@dataclass
class _Waiting:
    item: Any
    answer: asyncio.Future = field(repr=False)


class Batcher:
    """One model version's queue and the task that empties it, batch by batch."""

    def __init__(
        self,
        forward: Forward,
        executor: Executor,
        *,
        max_batch_size: int,
        max_wait_s: float,
        on_batch: BatchDone | None = None,
    ) -> None:
        if max_batch_size < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch_size {max_batch_size} must be >= 1 and max_wait_s {max_wait_s} >= 0")
        self.forward, self.executor = forward, executor
        self.max_batch_size, self.max_wait_s, self.on_batch = max_batch_size, max_wait_s, on_batch
        self._queue: asyncio.Queue[_Waiting] = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._coming = 0  # requests announced (bodies being read) whose items are not queued yet

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

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
        if self._task is None or self._task.done():
            raise RuntimeError("the batcher is not running")
        answer = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Waiting(item, answer))
        return answer

    async def submit(self, item: Any) -> Any:
        return await self.enqueue(item)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _gather(self) -> list[_Waiting]:
        """The next batch: the first waiting image, then others until the batch is full, ``max_wait_s`` passed, or
        none is queued and none announced; those already queued join at once."""
        batch = [await self._queue.get()]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            if self._coming == 0:  # no other request on its way: waiting would only add latency
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), left))
            except asyncio.TimeoutError:
                break
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            batch = [waiting for waiting in batch if not waiting.answer.done()]  # a client that left
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self.executor, self.forward, [w.item for w in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"the forward pass gave {len(results)} results for {len(batch)} inputs")
            except Exception as error:  # noqa: BLE001 (the batch's requests get it; the batcher goes on)
                for waiting in batch:
                    if not waiting.answer.done():
                        waiting.answer.set_exception(error)
            else:
                for waiting, result in zip(batch, results, strict=True):
                    if waiting.answer.done():
                        continue
                    if isinstance(result, BaseException):  # this item's own failure (an image refused)
                        waiting.answer.set_exception(result)
                    else:
                        waiting.answer.set_result(result)
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - started)
