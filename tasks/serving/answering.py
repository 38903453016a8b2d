"""A prediction request from admission to answer, whichever API it came by (``/v1/predict``, the Open Inference
Protocol's infer): the version picked; the body read within its limits (413 past --max-body-mb, 408 past
--body-timeout-s), its bytes held against the bodies' bound (--max-queue x --max-body-mb) from arrival to answer;
its images counted before any is built and admitted to the queue (413 past --max-queue, 503 with ``Retry-After``
while it is full); the images queued for the batcher (decoded and run in the network's thread); each outcome
counted and timed by the version that answered. ``Refused`` is every error a client is told, as JSON with its
status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect

from tasks.errors import UnreadableImageError
from tasks.serving.endpoint import Endpoint, NotReadyError, Served

logger = logging.getLogger("tasks.serving")
VERSION_HEADER = "X-Model-Version"
RAW_IMAGE_TYPES = ("image/", "application/octet-stream")
RETRY_AFTER_S = "1"
RETRY = {"Retry-After": RETRY_AFTER_S}
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

    @property
    def most_held_bytes(self) -> int:
        return self.settings.max_queue * self.settings.max_body_bytes

    def cannot_admit(self) -> str | None:
        """Why no request can be admitted now (None: one can): what ``/readyz`` says, and the next request's 503."""
        settings, endpoint = self.settings, self.endpoint
        if endpoint.admitted >= settings.max_queue:
            return f"the queue is full ({endpoint.admitted} of {settings.max_queue} images, --max-queue)"
        if endpoint.held_bytes > self.most_held_bytes - settings.max_body_bytes:
            return (
                f"the bodies received hold {endpoint.held_bytes:,} bytes: no room for one more of --max-body-mb "
                f"({self.most_held_bytes:,} in all, --max-queue x --max-body-mb)"
            )
        return None

    async def read_body(self, request: Request, watch: Callable[[bytes], None] | None = None) -> bytes:
        """The body, within --max-body-mb (413) and --body-timeout-s (408); ``watch`` sees each chunk as it
        arrives (and may refuse it). Its bytes count against the bodies' bound from arrival to the answer: a
        client that sends nothing holds nothing."""
        declared = request.headers.get("content-length")
        limit = self.settings.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Refused(413, f"the body is {int(declared):,} bytes, more than {limit:,} (--max-body-mb)")
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise Refused(413, f"the body is more than {limit:,} bytes (--max-body-mb)")
                    self._hold(request, len(chunk))
                    if self.endpoint.held_bytes > self.most_held_bytes:
                        raise Refused(503, f"{self.cannot_admit()}: try again", headers=RETRY)
                    if watch is not None:
                        watch(chunk)
                    chunks.append(chunk)
        except ClientDisconnect:
            raise Refused(CLIENT_LEFT, "the client left before its body arrived") from None
        except TimeoutError:
            raise Refused(
                408,
                f"the body did not arrive within {self.settings.body_timeout_s:g} s (--body-timeout-s): "
                f"{size:,} bytes came of {declared or 'a length not declared'}",
            ) from None
        return b"".join(chunks)

    def _hold(self, request: Request, size: int) -> None:
        request.state.held_bytes = getattr(request.state, "held_bytes", 0) + size
        self.endpoint.held_bytes += size

    async def images_of(self, request: Request) -> list[tuple[str, bytes]]:
        """(part name, encoded image) for each image a /v1/predict request sent."""
        content_type, _, options = request.headers.get("content-type", "").partition(";")
        content_type = content_type.strip().lower()
        if content_type.startswith(RAW_IMAGE_TYPES):
            return [("body", await self.read_body(request))]
        if content_type != "multipart/form-data":
            raise Refused(
                415,
                f"content type {content_type or 'none'!r}: send one image as the body (image/jpeg, image/png, … or "
                "application/octet-stream) or images as multipart/form-data",
            )
        body = await self.read_body(request)
        boundary = parse_options_header(f"x;{options}")[1].get(b"boundary", b"")
        # Its parts counted from their delimiters (the closing one too) before the form is parsed: at most
        # --max-queue, so parsing never builds an object and a file for each of millions.
        delimiter = b"--" + boundary
        delimited = body.count(b"\r\n" + delimiter) + body.startswith(delimiter) - 1 if boundary else 0
        if delimited > self.settings.max_queue:
            raise Refused(413, self.too_many(f"{delimited:,} parts"))
        # The form parser reads the body from there (Starlette's Request.stream): read once, within the limit.
        request._body = body
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

    def too_many(self, what: str) -> str:
        return (
            f"the request holds {what}, more than the {self.settings.max_queue} admitted at once "
            "(--max-queue): send them in several requests"
        )

    def admit(self, count: int) -> None:
        """``count`` images into the queue: 413 when they could never be, 503 (Retry-After) when not now."""
        if count > self.settings.max_queue:
            raise Refused(413, self.too_many(f"{count:,} images"))
        if self.endpoint.admitted + count > self.settings.max_queue:
            raise Refused(
                503,
                f"the queue is full ({self.endpoint.admitted} of {self.settings.max_queue} images waiting): try again",
                headers=RETRY,
            )
        self.endpoint.admitted += count
        self.metrics.queue_depth.set(self.endpoint.admitted)

    def leave(self, request: Request, count: int) -> None:
        self.endpoint.admitted -= count
        self.endpoint.held_bytes -= getattr(request.state, "held_bytes", 0)
        self.metrics.queue_depth.set(self.endpoint.admitted)

    def pick(self) -> Served:
        try:
            return self.endpoint.pick()
        except NotReadyError as error:
            raise Refused(503, str(error), headers=RETRY) from None

    async def results(self, served: Served, answers: list[asyncio.Future]) -> np.ndarray:
        """The probabilities (N x classes) of a request's queued images once their batches ran: decoded and run in
        the network's thread (ServedModel.run); an image refused there is this request's 400 or 413."""
        try:
            return np.stack(await asyncio.gather(*answers))
        except UnreadableImageError as error:
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
            full = self.cannot_admit()
            if full:  # at once, before the body is read
                raise Refused(503, f"{full}: try again", headers=RETRY)
            self.endpoint.bind(served)
            served.batcher.announce()  # its body is on its way: a gathering batch waits for it (max_wait at most)
            announced = True
            try:
                parts = await parts_of(request)
                self.admit(len(parts))
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
            self.leave(request, admitted)
            self.metrics.requests.labels(endpoint_name, str(status), label).inc()
            if status == 200:
                self.metrics.latency.labels(label).observe(time.perf_counter() - started)
