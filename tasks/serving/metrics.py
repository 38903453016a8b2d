"""The endpoint's Prometheus metrics (prometheus-client), on a registry of its own, served at ``/metrics``.

Every figure about answering carries the model version that answered (``version``: ``name/3``), so a canary's
requests, latency and batches are told apart from the primary's.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "image_classifier_serve"
# Request latency, seconds: from a few milliseconds (one image, idle) to the queue's worst under overload.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Requests answered, by endpoint, HTTP status and the model version that answered ('' when none did)",
            ["endpoint", "status", "version"],
            registry=self.registry,
        )
        self.latency = self._per_version(
            "request_seconds", "Seconds from a prediction request's arrival to its answer", LATENCY_BUCKETS
        )
        self.batch_size = self._per_version("batch_size", "Images per forward pass", BATCH_BUCKETS)
        self.forward_seconds = self._per_version(
            "forward_seconds", "Seconds per forward pass (decoding on the device included on CUDA)", LATENCY_BUCKETS
        )
        self.queue_depth = Gauge(
            f"{PREFIX}_queue_depth",
            "Images admitted and not yet answered (decoded, queued or in a forward pass)",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            f"{PREFIX}_requests_in_flight",
            "HTTP requests being answered (the probes and /metrics left out): what SIGTERM's drain waits for",
            registry=self.registry,
        )
        self.model = Gauge(
            f"{PREFIX}_model_info",
            "1 for each model version being served, by role (primary, canary) and the weights' sha256",
            ["name", "version", "role", "sha256"],
            registry=self.registry,
        )
        self.load_failures = Counter(
            f"{PREFIX}_model_load_failures",
            "Versions the followed alias named that could not be fetched, verified or loaded (the old one served on)",
            ["reference"],
            registry=self.registry,
        )
        self.records_dropped = Counter(
            f"{PREFIX}_records_dropped",
            "Answers --record did not keep, by reason (queue full, not written, image not stored): never a failed request",
            ["reason"],
            registry=self.registry,
        )
        self.swaps = Counter(
            f"{PREFIX}_model_swaps",
            "Times a new version was swapped in for the followed alias",
            registry=self.registry,
        )

    def _per_version(self, name: str, what: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(
            f"{PREFIX}_{name}", f"{what}, by model version", ["version"], buckets=buckets, registry=self.registry
        )
