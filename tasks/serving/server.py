"""The endpoint's process: the model's files checked before the port opens, uvicorn serving the app, the network
loaded and warmed while ``/healthz`` already answers, and SIGTERM drained (``DrainingServer``)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from types import FrameType

import uvicorn

from tasks.errors import PipelineInputError
from tasks.serving.app import create_app
from tasks.serving.endpoint import Endpoint
from tasks.serving.metrics import ServeMetrics
from tasks.serving.settings import ServeSettings

logger = logging.getLogger("tasks.serving")
# On SIGTERM the server stops once no request has been in flight for this long: a load balancer that has not yet
# seen /readyz turn 503 may still send a few, and they are answered.
DRAIN_QUIET_S = 1.0


class DrainingServer(uvicorn.Server):
    """uvicorn's server, where SIGTERM first turns ``/readyz`` to 503 and answers the requests in flight and those
    still arriving, until none has been for ``DRAIN_QUIET_S`` (``drain_s`` at most), before uvicorn's own shutdown;
    a second SIGTERM, or SIGINT, stops at once."""

    def __init__(self, config: uvicorn.Config, endpoint: Endpoint) -> None:
        super().__init__(config)
        self.endpoint, self.drain_until = endpoint, 0.0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        endpoint = self.endpoint
        if sig == signal.SIGTERM and not endpoint.draining and self.started:
            endpoint.draining = True
            self.drain_until = time.monotonic() + endpoint.settings.drain_s
            logger.info(
                "SIGTERM: /readyz answers 503; answering the %d requests in flight and those still arriving until "
                "none has for %g s (%g s at most)",
                endpoint.in_flight,
                DRAIN_QUIET_S,
                endpoint.settings.drain_s,
            )
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        endpoint = self.endpoint
        if endpoint.draining and not self.should_exit:
            if endpoint.quiet_for() >= DRAIN_QUIET_S or time.monotonic() > self.drain_until:
                if endpoint.in_flight:
                    logger.warning("--drain-s passed with %d requests in flight: stopping", endpoint.in_flight)
                else:
                    logger.info("drained: no request in flight for %g s; stopping", DRAIN_QUIET_S)
                self.should_exit = True
        return await super().on_tick(counter)


def serve(settings: ServeSettings, prog: str) -> int:
    """Serve until stopped: 0 after a drain or Ctrl-C, 1 when the network could not be loaded, 2 for a mistake."""
    endpoint = Endpoint(settings, ServeMetrics())
    # An unknown model or a version whose files differ from their registration is told before the port opens.
    try:
        located = {
            reference: endpoint.locate(reference) for reference in filter(None, (settings.model, settings.canary))
        }
    except PipelineInputError as error:
        asyncio.run(endpoint.close())
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    outcome = {"status": 0}

    async def starting() -> None:
        try:
            primary = await asyncio.to_thread(endpoint.load, settings.model, None, located[settings.model])
            canary = (
                await asyncio.to_thread(endpoint.load, settings.canary, None, located[settings.canary])
                if settings.canary
                else None
            )
            await endpoint.start(primary, canary)
        except Exception as error:  # noqa: BLE001 (told in one line; the process exits 1)
            logger.error("the model could not be loaded: %s: %s", type(error).__name__, error)
            outcome["status"] = 1
            server.should_exit = True

    config = uvicorn.Config(
        create_app(endpoint, starting()),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )
    server = DrainingServer(config, endpoint)
    scheme = "https" if settings.ssl_certfile else "http"
    print(f"{prog}: {settings.model} on {scheme}://{settings.host}:{settings.port} (the API: /docs)", file=sys.stderr)
    server.run()
    return outcome["status"]
