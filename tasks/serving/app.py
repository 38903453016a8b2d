"""The HTTP API (FastAPI): ``/v1/predict``, ``/v1/model``, ``/healthz``, ``/readyz``, ``/metrics`` and the Open
Inference Protocol's ``/v2/...``. docs/serving.md describes each; FastAPI's own page is ``/docs``.

Every error is JSON ``{"error": "...", "part": "..."}`` (``part`` when one image of the request is to blame) with
its status, FastAPI's own included (an unknown path, a wrong method, a bad query parameter): docs/serving.md's
table. A client never sees a traceback; the log has it. Requests are counted by a fixed set of endpoint names,
never by a path a client chose.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from tasks.serving import oip
from tasks.serving.answering import RETRY, VERSION_HEADER, Answering, Refused
from tasks.serving.endpoint import Endpoint, Served
from tasks.serving.metrics import ServeMetrics

logger = logging.getLogger("tasks.serving")
# Open to anyone who reaches the port, token or not: the probes of a load balancer or Kubernetes, and the API's
# description (it says nothing about the model).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/docs", "/openapi.json"})
UNCOUNTED_PATHS = OPEN_PATHS | {"/metrics"}  # not requests in flight for SIGTERM's drain
UNAUTHORIZED = "unauthorized"  # the endpoint a refused request is counted under, whatever path it asked for


def _shown(text: str, most: int = 80) -> str:
    """A client's text quoted in an error: one line (newlines escaped), and short."""
    quoted = repr(text)
    return quoted if len(quoted) <= most else f"{quoted[: most - 1]}…"


def _package_version() -> str:
    try:
        return version("image-classifier-pipeline")
    except PackageNotFoundError:
        return "unknown"


def create_app(endpoint: Endpoint, starting: Any = None) -> FastAPI:
    """The app around ``endpoint`` (a request's lifecycle: answering.py). ``starting`` (an awaitable) runs in the lifespan, in the background: the
    model's loading, so that ``/healthz`` answers while it loads and ``/readyz`` once it is warm."""
    settings, metrics = endpoint.settings, endpoint.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.get_running_loop().create_task(starting) if starting is not None else None
        app.state.loading = task
        yield
        if task is not None and not task.done():
            task.cancel()
        await endpoint.close()

    app = FastAPI(
        title="image-classifier serve",
        version=_package_version(),
        description="A registered image classifier answering HTTP requests, batched (docs/serving.md).",
        lifespan=lifespan,
    )

    unauthorized = metrics.requests.labels(UNAUTHORIZED, "401", "") if settings.token is not None else None

    def authorized(request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), settings.token.encode())

    @app.middleware("http")
    async def token_and_drain(request: Request, call_next):  # noqa: ANN202
        """The bearer token checked (when one is set), and the request counted in flight for SIGTERM's drain."""
        path = request.url.path
        if unauthorized is not None and path not in OPEN_PATHS and not authorized(request):
            unauthorized.inc()
            return JSONResponse(
                {"error": "this endpoint needs 'Authorization: Bearer <token>' (docs/serving.md, Security)"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        if path in UNCOUNTED_PATHS:
            return await call_next(request)
        endpoint.requests_seen(+1)
        try:
            return await call_next(request)
        finally:
            endpoint.requests_seen(-1)

    @app.exception_handler(Refused)
    async def refused(request: Request, error: Refused) -> JSONResponse:
        content: dict[str, Any] = {"error": str(error)}
        if error.part is not None:
            content["part"] = error.part
        return JSONResponse(content, status_code=error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def not_routed(request: Request, error: HTTPException) -> JSONResponse:
        """Starlette's router: no route for the path (404), or none for its method (405, with ``Allow``)."""
        where = f"{request.method} {_shown(request.url.path)}"
        if error.status_code == 404:
            message = f"no endpoint {where}: the endpoints are listed on /docs"
        elif error.status_code == 405:
            allowed = (error.headers or {}).get("Allow", "another method")
            message = f"{where}: the method is not allowed here; it takes {allowed}"
        else:
            message = f"{where}: {error.detail}"
        return JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, error: RequestValidationError) -> JSONResponse:
        """A query parameter FastAPI could not take (``top_k=0``): 400, naming it and what it takes."""
        problems = []
        for problem in error.errors():
            where, *name = problem["loc"]
            message = problem["msg"][:1].lower() + problem["msg"][1:]
            given = problem.get("input")
            given = given if isinstance(given, str) and given.isprintable() and len(given) < 40 else _shown(given, 40)
            problems.append(f"{where} parameter {'.'.join(map(str, name))}={given}: {message}")
        return JSONResponse({"error": "; ".join(problems)}, status_code=400)

    @app.exception_handler(Exception)
    async def our_bug(request: Request, error: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"error": f"internal error ({type(error).__name__}); the server's log has it"}, 500)

    answering = Answering(endpoint)

    # -- the project's own API ------------------------------------------------------------------------------
    @app.post(
        "/v1/predict",
        summary="Label one image (the raw body) or several (multipart/form-data file parts)",
        responses={
            200: {"description": "each image's label and most probable classes; the version in X-Model-Version"},
            400: {"description": "an image Pillow cannot read (the part is named), or a bad top_k"},
            408: {"description": "the body did not arrive within --body-timeout-s"},
            413: {"description": "a body or an image (pixels) over the limit, or more images than --max-queue"},
            415: {"description": "neither an image type nor multipart/form-data"},
            503: {"description": "not ready yet, or the queue is full (Retry-After)"},
        },
    )
    async def predict(
        request: Request, top_k: int = Query(3, ge=1, description="how many of the most probable classes to give")
    ) -> Response:
        def respond(served: Served, parts: list[tuple[str, bytes]], probabilities: np.ndarray) -> Response:
            predictions = served.model.loaded.predictions([name for name, _ in parts], probabilities)
            rows = [{"image": p.image, "label": p.label, "top": dict(p.top(top_k))} for p in predictions]
            identity = served.identity
            model = {"name": identity.name, "version": identity.version, "precision": identity.precision}
            return JSONResponse({"model": model, "predictions": rows})

        return await answering.answer(request, "/v1/predict", answering.images_of, respond)

    @app.get("/v1/model", summary="The model being served: name, version, alias, classes, weights' sha256, runtime")
    async def model() -> dict[str, Any]:
        if endpoint.primary is None:
            raise Refused(503, "the model is still loading", headers=RETRY)

        def described(served: Served) -> dict[str, Any]:
            identity = served.identity
            return {
                "name": identity.name,
                "version": identity.version,
                "alias": identity.alias,
                "classes": served.model.classes,
                "sha256": identity.sha256,
                "runtime": identity.runtime,
                "precision": identity.precision,
                "device": str(served.model.device),
            }

        shown = described(endpoint.primary)
        if endpoint.canary is not None:
            shown["canary"] = {**described(endpoint.canary), "percent": settings.canary_percent}
        return shown

    @app.get("/healthz", summary="The process is alive", response_class=JSONResponse)
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    def not_ready() -> str | None:
        """Why a request would not be admitted now (None: it would)."""
        if endpoint.draining:
            return "stopping (SIGTERM): answering the requests in flight"
        if endpoint.primary is None:
            loading = getattr(app.state, "loading", None)
            done = loading is not None and loading.done()
            return "the model could not be loaded: the log says why" if done else "the model is still loading"
        return answering.cannot_admit()

    @app.get("/readyz", summary="The model is loaded and warmed, the server can admit a request and is not stopping")
    async def readyz() -> Response:
        why = not_ready()
        if why is None:
            return JSONResponse({"status": "ready", "model": endpoint.describe()})
        return JSONResponse({"error": f"not ready: {why}"}, status_code=503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- the Open Inference Protocol ------------------------------------------------------------------------
    def served_as(name: str, model_version: str | None = None) -> Served:
        for served in endpoint.versions():
            identity = served.identity
            if identity.name == name and (model_version is None or str(identity.version) == model_version):
                return served
        serving = ", ".join(s.identity.label for s in endpoint.versions()) or "nothing yet"
        wanted = name if model_version is None else f"{name} version {model_version}"
        raise Refused(404, f"{wanted} is not served here (serving {serving})")

    @app.get("/v2", summary="Open Inference Protocol: server metadata")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "image-classifier", "version": _package_version(), "extensions": ["binary_tensor_data"]}

    @app.get("/v2/health/live", summary="Open Inference Protocol: the server is alive")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready", summary="Open Inference Protocol: the server is ready")
    async def ready() -> Response:
        why = not_ready()
        return JSONResponse(
            {"ready": True} if why is None else {"error": f"not ready: {why}"}, 200 if why is None else 503
        )

    @app.get("/v2/models/{name}", summary="Open Inference Protocol: model metadata")
    @app.get("/v2/models/{name}/versions/{model_version}", summary="Open Inference Protocol: a version's metadata")
    async def model_metadata(name: str, model_version: str | None = None) -> dict[str, Any]:
        served = served_as(name, model_version)
        versions = [str(s.identity.version) for s in endpoint.versions() if s.identity.name == name]
        platform = "onnxruntime_onnx" if served.identity.runtime == "onnx" else "pytorch_torchvision"
        return oip.model_metadata(name, versions, platform, len(served.model.classes))

    @app.get("/v2/models/{name}/ready", summary="Open Inference Protocol: the model is ready")
    @app.get("/v2/models/{name}/versions/{model_version}/ready", summary="Open Inference Protocol: a version is ready")
    async def model_ready(name: str, model_version: str | None = None) -> dict[str, Any]:
        served_as(name, model_version)
        return {"name": name, "ready": True}

    async def infer(request: Request, name: str, model_version: str | None) -> Response:
        served = served_as(name, model_version) if model_version is not None else None
        if served is None:
            served_as(name)  # 404 for a model not served; the canary split applies to the name alone
        parsed: list[oip.InferRequest] = []

        async def parts_of(request: Request) -> list[tuple[str, bytes]]:
            try:
                size = oip.json_size(request.headers.get(oip.HEADER_LENGTH))
                body = await answering.read_body(request, oip.JsonCount(size, settings.max_queue).feed)
                # In a thread: base64 of up to a whole body, decoded in pieces that each let the event loop run.
                parsed.append(await asyncio.to_thread(oip.parse_infer_request, body, size, settings.max_queue))
            except oip.InferRequestError as error:
                raise Refused(error.status, str(error)) from None
            return [(f"{oip.INPUT_NAME}[{i}]", image) for i, image in enumerate(parsed[0].images)]

        def respond(served: Served, parts: list[tuple[str, bytes]], probabilities: np.ndarray) -> Response:
            classes = served.model.classes
            labels = [classes[int(i)] for i in probabilities.argmax(axis=1)]
            identity = served.identity
            body, headers = oip.infer_response(
                parsed[0], identity.name, str(identity.version), labels, probabilities, identity.precision
            )
            return Response(body, headers=headers)

        return await answering.answer(request, "/v2/infer", parts_of, respond, served)

    @app.post("/v2/models/{name}/infer", summary="Open Inference Protocol: label encoded images (a BYTES input)")
    async def infer_model(request: Request, name: str) -> Response:
        return await infer(request, name, None)

    @app.post("/v2/models/{name}/versions/{model_version}/infer", summary="Open Inference Protocol: with a version")
    async def infer_version(request: Request, name: str, model_version: str) -> Response:
        return await infer(request, name, model_version)

    return app


__all__ = ["OPEN_PATHS", "VERSION_HEADER", "ServeMetrics", "create_app"]
