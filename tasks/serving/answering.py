"""A prediction request from admission to answer, whichever API it came by (``/v1/predict``, the Open Inference
Protocol's infer): the version picked, the queue's bound kept (503 with ``Retry-After``), the body read within its
limit (413), the images queued for the batcher (decoded and run in the network's thread), each outcome counted and timed by the version that
answered. ``Refused`` is every error a client is told, as JSON with its status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from tasks.serving.endpoint import Endpoint, NotReadyError, Served
from tasks.serving.model import ImageRefused

logger = logging.getLogger("tasks.serving")
VERSION_HEADER = "X-Model-Version"
RAW_IMAGE_TYPES = ("image/", "application/octet-stream")
RETRY_AFTER_S = "1"
CLIENT_LEFT = 499  # counted for a request whose client went away before its answer (nginx's code)


class Refused(Exception):
    """A request answered with an error status and a JSON reason."""

    def __init__(self, status: int, message: str, part: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.part, self.headers = status, part, headers or {}


class Answering:
    """The request lifecycle the app's prediction routes share, around one ``Endpoint``."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint, self.settings, self.metrics = endpoint, endpoint.settings, endpoint.metrics

    async def read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.settings.max_body_bytes:
            raise Refused(
                413, f"the body is {int(declared):,} bytes, more than {self.settings.max_body_bytes:,} (--max-body-mb)"
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.settings.max_body_bytes:
                raise Refused(413, f"the body is more than {self.settings.max_body_bytes:,} bytes (--max-body-mb)")
            chunks.append(chunk)
        return b"".join(chunks)

    async def images_of(self, request: Request) -> list[tuple[str, bytes]]:
        """(part name, encoded image) for each image a /v1/predict request sent."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type.startswith(RAW_IMAGE_TYPES):
            return [("body", await self.read_body(request))]
        if content_type != "multipart/form-data":
            raise Refused(
                415,
                f"content type {content_type or 'none'!r}: send one image as the body (image/jpeg, image/png, … or "
                "application/octet-stream) or images as multipart/form-data",
            )
        # The form parser reads the body from there (Starlette's Request.stream): read once, within the limit.
        request._body = await self.read_body(request)
        try:
            form = await request.form(max_files=self.settings.max_queue, max_fields=self.settings.max_queue)
        except Exception as error:  # noqa: BLE001 (Starlette's MultiPartException and python-multipart's errors)
            raise Refused(400, f"the multipart body cannot be read: {error}") from None
        parts = []
        for field, value in form.multi_items():
            if isinstance(value, str):
                raise Refused(400, f"form field {field!r} is text: send each image as a file part", field)
            name = f"{field}:{value.filename}" if value.filename else field
            parts.append((name, await value.read()))
        if not parts:
            raise Refused(400, "the multipart body holds no file part: send each image as one")
        return parts

    def admit(self, count: int) -> None:
        if self.endpoint.admitted + count > self.settings.max_queue:
            raise Refused(
                503,
                f"the queue is full ({self.endpoint.admitted} of {self.settings.max_queue} images waiting): try again",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        self.endpoint.admitted += count
        self.metrics.queue_depth.set(self.endpoint.admitted)

    def leave(self, count: int) -> None:
        self.endpoint.admitted -= count
        self.metrics.queue_depth.set(self.endpoint.admitted)

    def pick(self) -> Served:
        try:
            return self.endpoint.pick()
        except NotReadyError as error:
            raise Refused(503, str(error), headers={"Retry-After": RETRY_AFTER_S}) from None

    async def results(self, served: Served, answers: list[asyncio.Future]) -> np.ndarray:
        """The probabilities (N x classes) of a request's queued images once their batches ran: decoded and run in
        the network's thread (ServedModel.run); an image refused there is this request's 400 or 413."""
        try:
            return np.stack(await asyncio.gather(*answers))
        except ImageRefused as error:
            raise Refused(error.status, str(error), error.part) from None
        except Exception as error:  # noqa: BLE001 (a forward pass that raised: this batch's requests only)
            logger.error("a forward pass of %s failed: %s: %s", served.identity.label, type(error).__name__, error)
            raise Refused(500, f"the model failed on this request's batch ({type(error).__name__})") from None

    async def answer(
        self, request: Request, endpoint_name: str, parts_of: Any, respond: Any, served: Served | None = None
    ) -> Response:
        """A prediction request from admission to answer, counted and timed by the version that answered."""
        started, label, status, admitted = time.perf_counter(), "", 500, 0
        try:
            served = served or self.pick()
            label = served.identity.label
            self.admit(1)  # the body's memory, before it is read
            admitted = 1
            self.endpoint.bind(served)
            served.batcher.announce()  # its body is on its way: a gathering batch waits for it (max_wait at most)
            announced = True
            try:
                parts = await parts_of(request)
                if len(parts) > 1:
                    self.admit(len(parts) - 1)
                    admitted = len(parts)
                answers = [served.batcher.enqueue((data, name)) for name, data in parts]
                served.batcher.withdraw()
                announced = False
                response = respond(served, parts, await self.results(served, answers))
            finally:
                if announced:
                    served.batcher.withdraw()
                self.endpoint.release(served)
            response.headers[VERSION_HEADER] = label
            status = response.status_code
            return response
        except Refused as error:
            status = error.status
            if label:
                error.headers = {**error.headers, VERSION_HEADER: label}
            raise
        except asyncio.CancelledError:
            status = CLIENT_LEFT
            raise
        finally:
            if admitted:
                self.leave(admitted)
            self.metrics.requests.labels(endpoint_name, str(status), label).inc()
            if status == 200:
                self.metrics.latency.labels(label).observe(time.perf_counter() - started)
