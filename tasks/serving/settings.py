"""What ``image-classifier serve`` is told: the model, where it listens, how it batches and what it admits.
Imports nothing heavy: the command line checks these before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.contracts.conversion_limits import DEFAULT_MAX_IMAGE_PIXELS
from tasks.contracts.scores_table import Precision, Runtime

DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 20 * 2**20  # a 48-megapixel phone photo as JPEG is 10-20 MB
DEFAULT_BODY_TIMEOUT_S = 10.0  # 20 MB at 16 Mbit/s; a client that sends nothing is answered 408 by then


@dataclass(frozen=True)
class ServeSettings:
    model: str  # a registry reference (name, name/3, name@production) or a ModelDirectory path
    registry: str = "registry"  # a folder or s3://bucket/prefix
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    runtime: Runtime = "torch"
    precision: Precision = "fp32"  # int8: ONNX Runtime's quantized model on the CPU (tasks/inference/int8.py)
    calibration: str | None = None  # int8 the first time: the validation images it is calibrated on
    device: str = "auto"  # auto: cuda when there is one, else cpu
    max_batch_size: int = 16  # images per forward pass
    max_wait_ms: float = 10.0  # how long the first image of a batch waits for others
    max_queue: int = 128  # images admitted at once (decoded, queued, in a pass); full: 503; more in a request: 413
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # past it: 413
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # a body not received within it: 408
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # width x height, read from the header; past it: 413
    poll_s: float = 5.0  # how often a followed alias is read
    canary: str | None = None  # a second version (name/7) given canary_percent of the requests
    canary_percent: float = 0.0
    drain_s: float = 30.0  # on SIGTERM: the longest wait for requests in flight
    decode_threads: int = 0  # threads decoding a batch's images; 0: the network's own thread
    ssl_certfile: str | None = None  # TLS through uvicorn: the certificate (chain) and its key, PEM
    ssl_keyfile: str | None = None
    token: str | None = field(default=None, repr=False)  # bearer token; required off loopback
    record: str | None = None  # a folder or s3:// prefix the answers are recorded into (tasks/monitoring); None: off
    record_sample: float = 1.0  # share of answered images recorded
    record_images: str = "none"  # none, low-confidence or all: which images' bytes are kept with their records
    record_max_bytes: int | None = None  # a local record folder's bound: the oldest segments go first
    record_segment_s: float = 60.0  # a segment is published once its first record is this old (or at 1,000 records)

    @property
    def follows_alias(self) -> bool:
        return "@" in self.model

    @property
    def max_wait_s(self) -> float:
        return self.max_wait_ms / 1000
