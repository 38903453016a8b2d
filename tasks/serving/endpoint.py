"""The versions being served and the moves between them: the primary (and a canary taking a share of the
requests), each with its own batcher; the alias followed in the registry, and the swap when it moves.

A request is bound to one version when it is admitted (``pick``) and stays on it to its answer, so requests in
flight during a swap finish on the old version. A new version is fetched, checked against its registered sha256,
loaded and warmed in the follower's thread, beside the one serving; the swap itself is one assignment on the event
loop. The old version leaves once its last bound request is answered. A version that fails to fetch, verify or
load leaves the serving one in place, with one line in the log and ``model_load_failures`` counted; moving the alias
back is the rollback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.registry_layout import parse_reference
from tasks.errors import PipelineInputError
from tasks.monitoring.recorder import Recorder, RecordSettings
from tasks.registry.core import resolve
from tasks.serving.batching import Batcher
from tasks.serving.metrics import ServeMetrics
from tasks.serving.model import Identity, ServedModel, locate
from tasks.serving.settings import ServeSettings

logger = logging.getLogger("tasks.serving")
RETRY_FAILED_S = 30.0  # a version that failed to load is tried again this often (an S3 download each time)


class NotReadyError(Exception):
    """No version is loaded yet (or the server is stopping and has none)."""


@dataclass(eq=False)
class Served:
    model: ServedModel
    batcher: Batcher
    role: str  # primary, canary
    bound: int = 0  # requests admitted to this version and not yet answered
    retiring: bool = False
    gone: bool = False  # retired: its batcher stopped

    @property
    def identity(self) -> Identity:
        return self.model.identity


class Endpoint:
    """What the HTTP app asks for a version to answer with; owns the threads that decode and run the network."""

    def __init__(self, settings: ServeSettings, metrics: ServeMetrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.device = settings.device if settings.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.cache = Path(tempfile.mkdtemp(prefix="image-classifier-serve-"))  # S3 downloads, sha256 memos
        # 0 (the default): a batch's images are decoded in the network's own thread, one after another
        self.decoder = (
            ThreadPoolExecutor(settings.decode_threads, thread_name_prefix="decode")
            if settings.decode_threads
            else None
        )
        self.turn = threading.Lock()  # one forward pass at a time, whichever version's
        self.recorder = (
            Recorder(
                RecordSettings(
                    settings.record,
                    sample=settings.record_sample,
                    images=settings.record_images,
                    max_bytes=settings.record_max_bytes,
                    segment_seconds=settings.record_segment_s,
                ),
                on_drop=lambda reason: metrics.records_dropped.labels(reason).inc(),
            )
            if settings.record
            else None
        )
        self.primary: Served | None = None
        self.canary: Served | None = None
        self.draining = False
        self.admitted = 0  # images admitted and not answered (bounded by settings.max_queue)
        self.held_bytes = 0  # request bodies' bytes received and not answered (max_queue x max_body_bytes at most)
        self.in_flight = 0  # HTTP requests being answered (the probes left out)
        self.last_request = time.monotonic()  # when one last arrived or was answered
        self._picks = 0
        self._follower: AliasFollower | None = None
        self._leaving: set[asyncio.Task] = set()

    # -- what the app asks -------------------------------------------------------------------------------
    def pick(self) -> Served:
        """The version the next request goes to: the canary for ``canary_percent`` of them, spread evenly
        (request n goes to the canary when n * percent / 100 passes a whole number), else the primary."""
        if self.primary is None:
            raise NotReadyError("the model is still loading: ask /readyz")
        self._picks += 1
        share = self.settings.canary_percent / 100
        if self.canary is not None and math.floor(self._picks * share) > math.floor((self._picks - 1) * share):
            return self.canary
        return self.primary

    def requests_seen(self, change: int) -> None:
        self.in_flight += change
        self.metrics.in_flight.set(self.in_flight)
        self.last_request = time.monotonic()

    def quiet_for(self) -> float:
        """Seconds since the last request was answered, with none in flight (0 while one is)."""
        return 0.0 if self.in_flight else time.monotonic() - self.last_request

    def bind(self, served: Served) -> None:
        served.bound += 1

    def release(self, served: Served) -> None:
        served.bound -= 1
        if served.retiring and served.bound == 0:
            leaving = asyncio.get_running_loop().create_task(self._leave(served))
            self._leaving.add(leaving)  # held until done: the loop keeps only a weak reference
            leaving.add_done_callback(self._leaving.discard)

    def versions(self) -> list[Served]:
        return [served for served in (self.primary, self.canary) if served is not None]

    # -- loading and swapping ------------------------------------------------------------------------------
    def locate(self, model: str) -> tuple[ModelDirectory, Identity]:
        """Find and check a version's files (blocking): ``model.locate`` with this endpoint's registry and cache."""
        return locate(model, self.settings.registry, self.cache, self.settings.runtime, self.settings.precision)

    def load(
        self, model: str, alias: str | None = None, located: tuple[ModelDirectory, Identity] | None = None
    ) -> ServedModel:
        """Fetch, check, load and warm a version (blocking: a thread's work); ``alias``: the one it was found by;
        ``located``: what ``locate`` already gave for it."""
        model_dir, identity = located or self.locate(model)
        if alias is not None:
            identity = replace(identity, alias=alias)
        served = ServedModel(
            model_dir,
            identity,
            device=self.device,
            max_pixels=self.settings.max_image_pixels,
            calibration=self.settings.calibration,
            recorder=self.recorder,
        )
        served.warm([1, self.settings.max_batch_size])
        return served

    def _serve(self, model: ServedModel, role: str) -> Served:
        def batch_done(size: int, seconds: float) -> None:
            self.metrics.batch_size.labels(model.identity.label).observe(size)
            self.metrics.forward_seconds.labels(model.identity.label).observe(seconds)

        batcher = Batcher(
            lambda items: model.run(items, self.decoder),
            self.turn,
            max_batch_size=self.settings.max_batch_size,
            max_wait_s=self.settings.max_wait_s,
            on_batch=batch_done,
            name=f"batch {model.identity.label}",
        )
        batcher.start()
        identity = model.identity
        self.metrics.model.labels(identity.name, str(identity.version or ""), role, identity.sha256).set(1)
        return Served(model, batcher, role)

    async def start(self, primary: ServedModel, canary: ServedModel | None) -> None:
        """Serve what ``load`` gave (the event loop's side), and follow the alias when MODEL names one."""
        self.primary = self._serve(primary, "primary")
        if canary is not None:
            self.canary = self._serve(canary, "canary")
        if self.settings.follows_alias and not Path(self.settings.model).is_dir():
            self._follower = AliasFollower(self, asyncio.get_running_loop())
            self._follower.start()
        logger.info("serving %s (%s)", self.describe(), primary.identity.source)

    async def swap(self, model: ServedModel) -> None:
        """Put ``model`` in the primary's place at once; the old one leaves when its requests are answered."""
        old, self.primary = self.primary, self._serve(model, "primary")
        self.metrics.swaps.inc()
        if old is not None:
            old.retiring = True
            if old.bound == 0:
                await self._leave(old)

    async def _leave(self, served: Served) -> None:
        if served.gone:
            return
        served.gone = True
        await served.batcher.stop()
        identity = served.identity
        try:
            self.metrics.model.remove(identity.name, str(identity.version or ""), served.role, identity.sha256)
        except KeyError:
            pass
        root = served.model.model_dir.root
        if root.is_relative_to(self.cache):  # a download from S3: not needed any more
            shutil.rmtree(root, ignore_errors=True)

    def describe(self) -> str:
        text = self.primary.identity.label if self.primary else "nothing yet"
        if self.canary is not None:
            text += f", canary {self.canary.identity.label} ({self.settings.canary_percent:g}%)"
        return text

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
            await asyncio.to_thread(self._follower.join, 10)
        for served in self.versions():
            await served.batcher.stop()
        if self.decoder is not None:
            self.decoder.shutdown(wait=False, cancel_futures=True)
        if self.recorder is not None:  # what it still holds is published
            await asyncio.to_thread(self.recorder.close)
        shutil.rmtree(self.cache, ignore_errors=True)


class AliasFollower(threading.Thread):
    """Reads the followed alias every ``poll_s`` seconds; when it names another version, loads that one beside
    the serving one and swaps. A version that fails is told once (one line, one count) and tried again every
    ``RETRY_FAILED_S``, in case it is mended; the serving version stays until one loads."""

    def __init__(self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name="follow-alias", daemon=True)
        self.endpoint, self.loop = endpoint, loop
        self.reference = parse_reference(endpoint.settings.model)
        self._stopped = threading.Event()
        self._told: set[str] = set()
        self._failed_at: dict[str, float] = {}  # version -> when it last failed to load

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        settings = self.endpoint.settings
        while not self._stopped.wait(settings.poll_s):
            try:
                registration = resolve(settings.registry, self.reference)
            except Exception as error:  # noqa: BLE001 (an unreachable registry: the serving version stays)
                self._tell(f"read:{error}", f"cannot read {self.reference} in {settings.registry}: {error}")
                continue
            serving = self.endpoint.primary
            if serving is not None and serving.identity.version == registration.version:
                continue
            wanted = f"{registration.name}/{registration.version}"
            if time.monotonic() - self._failed_at.get(wanted, -RETRY_FAILED_S) < RETRY_FAILED_S:
                continue
            try:
                model = self.endpoint.load(wanted, self.reference.alias)
            except (PipelineInputError, OSError, RuntimeError) as error:
                self._failed_at[wanted] = time.monotonic()
                still = serving.identity.label if serving else "nothing"
                if self._tell(
                    wanted, f"{self.reference} moved to {wanted}, not served: {error}; still serving {still}"
                ):
                    self.endpoint.metrics.load_failures.labels(wanted).inc()
                continue
            asyncio.run_coroutine_threadsafe(self.endpoint.swap(model), self.loop).result()
            self._told.discard(wanted)
            self._failed_at.pop(wanted, None)
            logger.info(
                "%s moved: now serving %s (was %s)",
                self.reference,
                wanted,
                serving.identity.label if serving else "nothing",
            )

    def _tell(self, key: str, line: str) -> bool:
        """Log ``line`` once per ``key``; True when it was logged now."""
        if key in self._told:
            return False
        self._told.add(key)
        logger.error(line)
        return True
