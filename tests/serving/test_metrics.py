"""The endpoint's Prometheus metrics: each answer counted and timed under the version that answered, so a canary's
figures are told apart from the primary's; a registry of its own, so two endpoints in one process never clash."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tasks.serving.metrics import ServeMetrics


def samples(metrics: ServeMetrics) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_requests_and_latency_are_counted_per_answering_version():
    metrics = ServeMetrics()
    for version in ("colours/3", "colours/3", "colours/4"):
        metrics.requests.labels("/v1/predict", "200", version).inc()
        metrics.latency.labels(version).observe(0.02)
    metrics.requests.labels("/v1/predict", "503", "").inc()
    seen = samples(metrics)
    requests = "image_classifier_serve_requests_total"
    assert seen[(requests, (("endpoint", "/v1/predict"), ("status", "200"), ("version", "colours/3")))] == 2
    assert seen[(requests, (("endpoint", "/v1/predict"), ("status", "200"), ("version", "colours/4")))] == 1
    assert seen[(requests, (("endpoint", "/v1/predict"), ("status", "503"), ("version", "")))] == 1
    assert seen[("image_classifier_serve_request_seconds_count", (("version", "colours/4"),))] == 1
    assert seen[("image_classifier_serve_request_seconds_bucket", (("le", "0.025"), ("version", "colours/3")))] == 2


def test_two_endpoints_in_one_process_keep_their_own_figures():
    first, second = ServeMetrics(), ServeMetrics()
    first.swaps.inc()
    first.queue_depth.set(5)
    assert samples(first)[("image_classifier_serve_model_swaps_total", ())] == 1
    assert samples(second)[("image_classifier_serve_model_swaps_total", ())] == 0
    assert samples(second)[("image_classifier_serve_queue_depth", ())] == 0
