"""The endpoint's recorder: answered images' records written off the request path.

``Recorder.offer`` only puts a record on a bounded queue and returns at once; one thread takes them off and
publishes a segment (tasks/monitoring/records.py) when it holds ``segment_records`` of them or its first is
``segment_seconds`` old. A full queue, a full disk or an unreachable bucket drops records: each is counted
(``dropped``, by reason), and a log line says so at most once a minute; a request is never slowed or failed by it.
With ``max_bytes`` the oldest segments of a local folder go first. Imports no torch, no Prefect."""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from tasks.monitoring.records import RecordFolder, encode, segment_name

logger = logging.getLogger("tasks.monitoring")

RecordImages = str  # "none", "low-confidence" or "all"
DROP_REASONS = ("queue full", "not written", "image not stored")
RECORD_IMAGES = ("none", "low-confidence", "all")
LOW_CONFIDENCE = 0.5  # with "low-confidence": an image whose top probability is below this is stored


@dataclass(frozen=True)
class RecordSettings:
    location: str
    sample: float = 1.0  # share of requests recorded
    images: RecordImages = "none"
    max_bytes: int | None = None
    segment_records: int = 1000
    segment_seconds: float = 60.0
    queue_size: int = 10_000


class Recorder:
    """Records handed over by the endpoint, published in segments by one thread of its own."""

    def __init__(self, settings: RecordSettings, on_drop: Callable[[str], None] = lambda reason: None) -> None:
        self.settings, self.on_drop = settings, on_drop
        self.folder = RecordFolder(settings.location)
        self._queue: queue.Queue[tuple[dict, bytes | None] | None] = queue.Queue(settings.queue_size)
        self.dropped: Counter[str] = Counter()
        self.published = 0
        self._told = 0.0  # when the last drop was logged (time.monotonic)
        self._sequence, self._seen = 0, 0
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    def wanted(self) -> bool:
        """Whether the next request is recorded: every n-th request for a share of 1/n (deterministic)."""
        self._seen += 1
        return int(self._seen * self.settings.sample) != int((self._seen - 1) * self.settings.sample)

    def keeps_image(self, confidence: float) -> bool:
        images = self.settings.images
        return images == "all" or (images == "low-confidence" and confidence < LOW_CONFIDENCE)

    def offer(self, record: dict, image: bytes | None = None) -> None:
        """Queue one record (and the image's bytes to store); never blocks."""
        try:
            self._queue.put_nowait((record, image))
        except queue.Full:
            self._drop("queue full", 1)

    def close(self, timeout: float = 10.0) -> None:
        """Publish what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _drop(self, reason: str, count: int, detail: str = "") -> None:
        """``reason`` is one of ``DROP_REASONS`` (a metric's label: a fixed set); ``detail`` goes to the log only."""
        self.dropped[reason] += count
        for _ in range(count):
            self.on_drop(reason)
        if time.monotonic() - self._told >= 60:
            self._told = time.monotonic()
            logger.warning(
                "recording: %d dropped (%s%s; %d in all so far)",
                count,
                reason,
                f": {detail}" if detail else "",
                sum(self.dropped.values()),
            )

    def _run(self) -> None:
        pending: list[dict] = []
        first_at = 0.0
        while True:
            wait = None if not pending else max(0.0, first_at + self.settings.segment_seconds - time.monotonic())
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = ()
            if item is None:
                self._publish(pending)
                return
            if item:
                record, image = item
                if image is not None:
                    record["image"] = self._store(record["sha256"], image)
                if not pending:
                    first_at = time.monotonic()
                pending.append(record)
            if pending and (
                len(pending) >= self.settings.segment_records
                or time.monotonic() - first_at >= self.settings.segment_seconds
            ):
                self._publish(pending)
                pending = []

    def _store(self, sha256: str, image: bytes) -> str | None:
        try:
            return self.folder.store_image(sha256, image)
        except Exception as error:  # noqa: BLE001 (a full disk, an unreachable bucket: the record goes on without it)
            self._drop("image not stored", 1, f"{type(error).__name__}: {error}")
            return None

    def _publish(self, records: list[dict]) -> None:
        if not records:
            return
        self._sequence += 1
        try:
            self.published += self.folder.publish(
                segment_name(dt.datetime.now(dt.UTC), self._sequence), encode(records)
            )
        except Exception as error:  # noqa: BLE001 (a full disk, an unreachable bucket: the records are dropped)
            self._drop("not written", len(records), f"{type(error).__name__}: {error}")
            return
        if self.settings.max_bytes is not None and not self.folder.on_s3:
            self._trim(self.settings.max_bytes)

    def _trim(self, max_bytes: int) -> None:
        sizes = self.folder.sizes()
        total = sum(size for _, size in sizes)
        for name, size in sizes[:-1]:  # the newest stays
            if total <= max_bytes:
                break
            self.folder.remove(name)
            total -= size
