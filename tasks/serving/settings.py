"""What ``image-classifier serve`` is told: the model, where it listens, how it batches and what it admits.
Imports nothing heavy: the command line checks these before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.contracts.conversion_limits import DEFAULT_MAX_IMAGE_PIXELS
from tasks.contracts.scores_table import Runtime

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 20 * 2**20  # a 48-megapixel phone photo as JPEG is 10-20 MB


@dataclass(frozen=True)
class ServeSettings:
    model: str  # a registry reference (name, name/3, name@production) or a ModelDirectory path
    registry: str = "registry"  # a folder or s3://bucket/prefix
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    runtime: Runtime = "torch"
    device: str = "auto"  # auto: cuda when there is one, else cpu
    max_batch_size: int = 16  # images per forward pass
    max_wait_ms: float = 10.0  # how long the first image of a batch waits for others
    max_queue: int = 128  # images admitted at once (read, decoded, queued, in a pass); past it: 503
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # past it: 413
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # width x height, read from the header; past it: 413
    poll_s: float = 5.0  # how often a followed alias is read
    canary: str | None = None  # a second version (name/7) given canary_percent of the requests
    canary_percent: float = 0.0
    drain_s: float = 30.0  # on SIGTERM: the longest wait for requests in flight
    decode_threads: int = 0  # threads decoding a batch's images; 0: the network's own thread
    ssl_certfile: str | None = None  # TLS through uvicorn: the certificate (chain) and its key, PEM
    ssl_keyfile: str | None = None
    token: str | None = field(default=None, repr=False)  # bearer token; required off loopback

    @property
    def follows_alias(self) -> bool:
        return "@" in self.model

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000
