"""Online serving side by side, in one run: the project's endpoint (``python -m tasks.serving``: dynamic batching, a
bounded queue, a registry alias followed) against the server a user would write (FastAPI, one forward pass per
request) and against LitServe with the same batch settings, under a closed-loop load of real JPEG photos at
concurrency 1, 8, 32 and 64, and ours again recording every answer; then one round at concurrency 32 on ours with
the registry alias moved half-way through. First the ceiling (bench/inference.py): what one process does at best
with the same model and photos, a batch decoded then run in turn, at its best thread setting. Prints one table and
issues 54's and 62's goals; writes ``bench/results/<date>-serve-<host>.json``. Asserts nothing.

    python -m bench.serve                                      # 4 servers x 4 levels, 20 s each, the swap: ~12 min
    python -m bench.serve --seconds 10 --concurrency 1 32      # shorter
    python -m bench.serve --only ours plain --no-swap

The servers, each a subprocess on a free loopback port, a fresh set for every level (so each level's peak memory is
its own), all of a level's running at once and taking the load in turn (``--slices`` turns each, ``--seconds``
in all per server: a drift in the machine's load falls on all of them alike), the others paused (SIGSTOP to their
process groups, SIGCONT for their own turn) during a server's turn, stopped (each its whole process group) when the
level ends, on an error and on Ctrl-C. Paused, because an idle server's wakeups slow the one measured far more than
the CPU they take: LitServe's inference worker polls its queue, about a tenth of a core, and beside it ours answered
30.4 requests/s at concurrency 32 where alone it answered 35.1 (2026-12-07; before that day every figure of this
script was taken beside the others running):

  ours      ``python -m tasks.serving bench-resnet18@production --registry <temporary> --max-batch-size B
            --max-wait-ms W --max-queue Q --poll-s 0.5``, ``POST /v1/predict?top_k=10`` (every class, as the
            others answer); batch sizes and forward-pass seconds from its ``/metrics`` histograms (the difference
            between the window's two ends).
  recording ours with ``--record <temporary> --record-segment-s 5``: every answer recorded (docs/monitoring.md).
  plain     ``python -m bench.serve --plain-server MODEL_DIR --port P``: ``plain_app`` below, FastAPI + uvicorn, a
            ``def`` endpoint (Starlette runs it in its thread pool, 40 threads) that reads the raw body and hands it
            to the one loaded model (``tasks.inference.LoadedModel``: decode, then a forward pass of a batch of
            one); ``POST /predict``. Batch size 1 by construction.
  litserve  ``python -m bench.serve --litserve-server MODEL_DIR --port P``: ``LitClassifier`` below, LitServe's
            LitAPI with ``max_batch_size=B``, ``batch_timeout=W`` (its own decode_request, batch, predict, unbatch,
            encode_response), ``LitServer(accelerator="cpu", devices=1, workers_per_device=1)`` (``"cuda"`` with
            ``--device cuda``): one inference worker process beside one HTTP process; ``POST /predict``. Batch sizes
            counted by ``LitClassifier.predict`` itself.

The model: ResNet-18 at 224 px with random weights (``bench.score.random_model_directory``: throughput does not
depend on what a network learned), 10 classes. Ours serves it from a temporary local registry holding two
versions (different random weights) with ``production`` on version 1; plain and LitServe load version 1's
folder. All three hold the same loaded model (``tasks.inference``: EXIF orientation, RGB, the eval transform, the
network traced on the CPU, one softmax), so what differs is the serving around it; each answers the label and every
class's probability. ``--device cuda`` (and ``--precision bf16``) puts every server's model and the ceiling's on the
GPU alike, a JPEG decoded there by nvJPEG with its batch (``bash bench/on_gpu.sh serve``; issue 62's goal there: ours
10x plain at concurrency 32, its batches filled).

The images: scikit-learn's two sample photographs (640 x 427) and six crops of them, as JPEG bytes at quality 90;
each request's body is one of them (``Content-Type: image/jpeg``), each client task cycling through them.

The load: ``C`` asyncio tasks in this process on one httpx client, each sending its next request as soon as its
previous answer came (closed loop); in each turn some seconds unmeasured (``--warmup`` in a server's first turn, 1 s
in the others, and never before the server's first answer) then its share of ``--seconds`` measured; a request counts when its answer arrives inside a
measured window. Throughput is 200 answers per second; latency percentiles are
over the 200 answers; errors are every other answer (status, or a connection error). On a small machine the load
generator shares the CPUs with the server: the same for all three.

CPU: over the measured windows, the CPU-seconds of the server's processes, of this process (the load generator)
and of everything else on the machine ("others": on a shared machine other people's work; a figure measured while
others were busy is the server's share of a smaller machine, and a server with many threads takes a bigger share
of it).
"requests per server CPU-s" is what a server answered per CPU-second it got.

Threads: this script sets none; every server keeps torch's default intra-op threads (the machine's cores as
torch counts them: "torch threads" in the first line printed, 2 on a 2-core machine). Ours runs the network in one
thread and decodes in ``--decode-threads`` threads (its default, min(8, cores)); LitServe's one inference worker
decodes and runs the network in turn in one thread; the plain server, as a user's would, runs each request in
Starlette's thread pool, so with ``C`` requests in flight up to ``min(C, 40)`` forward passes run at once, each
asking for that many intra-op threads.

Peak memory: VmHWM (/proc/<pid>/status) of every process of the server's process group, summed, read just before
the server is stopped: the peak over that server's whole life (start-up, its turns, idle through the others'). LitServe's is five
processes (the launcher, multiprocessing's manager and resource tracker, the HTTP server, the inference worker); a
sum of peaks can exceed the peak of the sum.

The swap round (ours only): a fresh server at concurrency 32 for ``--swap-seconds``; half-way through
``production`` moves from version 1 to 2 (``tasks.registry.set_alias``). Reported: errors (every answer of the
round), p99 overall, p99 before the move, p99 from the move until 2 s after answers switched (the first
version-2 or the last version-1 answer, by ``X-Model-Version``, whichever came later), and when they switched.
"""
# No ``from __future__ import annotations`` here: FastAPI and LitServe read the endpoints' annotations at run time
# (LitServe takes decode_request's annotation object itself as its endpoint's body type).

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import httpx
import numpy as np
import torch
from fastapi import Body, FastAPI
from PIL import Image

from bench.harness import PROJECT_ROOT, Figure, aligned, table
from deployments.local import free_port
from tasks.contracts.model_directory import ModelDirectory
from tasks.inference.loaded import LoadedModel

try:
    import litserve
except ImportError:  # the bench extra (pip install -e '.[bench]'); without it LitServe is left out of the run
    litserve = None

SERVERS = ("ours", "recording", "plain", "litserve")
MODEL_NAME = "bench-resnet18"
RESULTS = Path(__file__).resolve().parent / "results"
JPEG = {"Content-Type": "image/jpeg"}
RawBody = Annotated[bytes, Body(media_type="image/jpeg")]  # FastAPI hands a non-JSON body over as its bytes


# --- what the plain server and LitServe share: the one loaded model (tasks.inference), the answer -----------------


def answer(classes: Sequence[str], probabilities: np.ndarray) -> dict:
    values = probabilities.tolist()
    return {"label": classes[int(np.argmax(values))], "probabilities": dict(zip(classes, values))}


# --- (b) the plain server: what a user writes -----------------------------------------------------------------------

plain_app = FastAPI(title="plain: one forward pass per request")
plain_model: dict[str, LoadedModel] = {}


@plain_app.get("/readyz")
def plain_ready() -> dict:
    return {"ready": "model" in plain_model}


@plain_app.post("/predict")
def plain_predict(body: RawBody) -> dict:
    model = plain_model["model"]
    return answer(model.classes, model.probabilities([model.decode(body)])[0])


def run_plain_server(model_dir: str, port: int, device: str, precision: str) -> None:
    import uvicorn

    plain_model["model"] = LoadedModel(ModelDirectory(model_dir), device=device, precision=precision)
    print(f"plain server: torch threads {torch.get_num_threads()}", file=sys.stderr, flush=True)
    uvicorn.run(plain_app, host="127.0.0.1", port=port, log_level="warning")


# --- (c) LitServe with the same batch settings ----------------------------------------------------------------------


class LitClassifier(litserve.LitAPI if litserve else object):
    """The model behind LitServe: decode each request's bytes, stack, one forward pass, one answer per request.
    Each batch's size goes to ``batch_log`` (a line ``<unix time> <size> <forward seconds>``): LitServe reports
    none itself."""

    def __init__(
        self, model_dir: str, batch_log: str, max_batch_size: int, batch_timeout: float, precision: str
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.model_dir, self.batch_log, self.precision = model_dir, batch_log, precision

    def setup(self, device: str) -> None:  # LitServe's device for its worker: "cpu", or "cuda:0" on a GPU
        self.model = LoadedModel(ModelDirectory(self.model_dir), device=device, precision=self.precision)
        self.sizes = open(self.batch_log, "a", buffering=1)  # noqa: SIM115 (open for the worker's life)
        print(f"litserve worker: torch threads {torch.get_num_threads()}", file=sys.stderr, flush=True)

    def decode_request(self, request: RawBody) -> torch.Tensor:
        return self.model.decode(request)

    def batch(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return inputs

    def predict(self, x: list[torch.Tensor]) -> np.ndarray:
        started, clock = time.time(), time.perf_counter()
        probabilities = self.model.probabilities(x)
        self.sizes.write(f"{started:.6f} {len(x)} {time.perf_counter() - clock:.6f}\n")
        return probabilities

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        return list(output)

    def encode_response(self, output: np.ndarray) -> dict:
        return answer(self.model.classes, output)


def run_litserve_server(
    model_dir: str, port: int, batch_log: str, max_batch_size: int, max_wait_ms: float, device: str, precision: str
) -> None:
    from bench import serve  # the class by its module's name: LitServe pickles the API into a spawned worker

    api = serve.LitClassifier(model_dir, batch_log, max_batch_size, max_wait_ms / 1000, precision)
    accelerator = "cuda" if device.startswith("cuda") else "cpu"
    server = litserve.LitServer(api, accelerator=accelerator, devices=1, workers_per_device=1)
    server.run(host="127.0.0.1", port=port, log_level="warning", generate_client_file=False)


# --- the servers as subprocesses --------------------------------------------------------------------------------------


def process_group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
                    members.append(int(entry.name))
    return members


def peak_rss_mb(pids: Sequence[int]) -> dict[int, float]:
    """VmHWM of each process, in MB."""
    peaks = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks[pid] = int(line.split()[1]) / 1024
    return peaks


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU-seconds of each live process in ``pids``, summed."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU-seconds the whole machine has spent busy (every state but idle and iowait) since it booted."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    predict_path: str
    ready_path: str
    log: Path
    batch_log: Path | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300) -> float:
        """Start it in its own process group and wait until it answers ready; seconds that took."""
        started = time.monotonic()
        with open(self.log, "ab") as log:
            log.write(f"\n$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.argv, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.process.returncode}) before it was ready:\n{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return time.monotonic() - started
            time.sleep(0.25)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def peak_rss(self) -> dict[int, float]:
        return peak_rss_mb(process_group(self.process.pid)) if self.process else {}

    def cpu(self) -> dict[str, float]:
        """CPU-seconds so far: the server's processes, this process (the load generator), the whole machine."""
        return {
            "server": cpu_seconds(process_group(self.process.pid)) if self.process else 0.0,
            "client": time.process_time(),
            "machine": machine_busy_seconds(),
        }

    def pause(self, paused: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) its whole process group."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL to whatever of it is left after 10 s."""
        if self.process is None:
            return
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (self.process.poll() is None or process_group(pgid)):
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.process.wait()
        self.process = None


@dataclass
class Settings:
    seconds: float
    slices: int
    warmup: float
    max_batch_size: int
    max_wait_ms: float
    max_queue: int
    poll_s: float
    scratch: Path
    registry: Path
    model_dir: Path
    device: str = "cpu"
    precision: str = "fp32"


def make_server(kind: str, settings: Settings, tag: str) -> Server:
    port, log = free_port(), settings.scratch / f"{kind}-{tag}.log"
    python = sys.executable
    model = ["--device", settings.device, "--precision", settings.precision]  # every server alike
    if kind in ("ours", "recording"):
        argv = [python, "-m", "tasks.serving", f"{MODEL_NAME}@production", "--registry", str(settings.registry)]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--max-batch-size", str(settings.max_batch_size)]
        argv += ["--max-wait-ms", str(settings.max_wait_ms), "--max-queue", str(settings.max_queue)]
        argv += ["--poll-s", str(settings.poll_s), *model]
        if kind == "recording":  # every answer recorded (predictions, properties, embeddings), no image bytes
            argv += ["--record", str(settings.scratch / f"records-{tag}"), "--record-segment-s", "5"]
        return Server(kind, argv, port, "/v1/predict?top_k=10", "/readyz", log)  # every class, as the others
    if kind == "plain":
        argv = [python, "-m", "bench.serve", "--plain-server", str(settings.model_dir), "--port", str(port), *model]
        return Server(kind, argv, port, "/predict", "/readyz", log)
    batch_log = settings.scratch / f"litserve-{tag}.batches"
    argv = [python, "-m", "bench.serve", "--litserve-server", str(settings.model_dir), "--port", str(port)]
    argv += ["--batch-log", str(batch_log), "--max-batch-size", str(settings.max_batch_size)]
    argv += ["--max-wait-ms", str(settings.max_wait_ms), *model]
    return Server(kind, argv, port, "/predict", "/health", log, batch_log)


# --- the model, the registry, the photos ------------------------------------------------------------------------------


def prepare_registry(scratch: Path) -> tuple[Path, Path]:
    """Two versions of a random-weight ResNet-18 @224 (10 classes) in a local registry, ``production`` on
    version 1; (the registry, version 1's own folder)."""
    from bench.score import random_model_directory
    from tasks.contracts.model_directory import METRICS_FILE, TrainingMetrics
    from tasks.registry import DatasetLineage, register_model, set_alias
    from tasks.training.loop import write_training_log

    registry, classes = scratch / "registry", [f"class{i}" for i in range(10)]
    lineage = {"train": DatasetLineage(source="bench/serve.py: random weights", content_hash="0" * 64, images=0)}
    for version in (1, 2):
        model = random_model_directory(scratch / f"model-{version}", "resnet18", classes, 224)
        write_training_log(model.root, TrainingMetrics())  # no training: an empty record, as registering wants one
        (model.root / METRICS_FILE).write_text(TrainingMetrics().model_dump_json())
        registration, _ = register_model(
            registry, MODEL_NAME, model, metrics={"accuracy": 0.1}, params={"random_weights": True}, datasets=lineage
        )
        assert registration.version == version, registration.version
    set_alias(registry, MODEL_NAME, "production", 1)
    return registry, scratch / "model-1"


def photos() -> list[bytes]:
    """scikit-learn's two sample photographs and three crops of each (centre square, left half, top half), as
    JPEG bytes at quality 90."""
    from sklearn.datasets import load_sample_images

    images = []
    for pixels in load_sample_images().images:
        photo = Image.fromarray(pixels)
        w, h = photo.size
        side = min(w, h)
        crops = [(0, 0, w, h), ((w - side) // 2, 0, (w + side) // 2, side), (0, 0, w // 2, h), (0, 0, w, h // 2)]
        for box in crops:
            buffer = io.BytesIO()
            photo.crop(box).save(buffer, format="JPEG", quality=90)
            images.append(buffer.getvalue())
    return images


# --- the load -------------------------------------------------------------------------------------------------------


class Answer(NamedTuple):
    sent: float  # time.time() when sent
    latency_ms: float
    status: int  # the HTTP status; 0: no answer (a connection error or timeout)
    version: str | None  # X-Model-Version


@dataclass
class Round:
    answers: list[Answer]
    window: tuple[float, float]  # time.time() of the measured window's ends
    hooks: dict[str, tuple[float, Any]]  # name: (time.time() when it ran, what it returned)

    def measured(self, start: float | None = None, end: float | None = None) -> list[Answer]:
        start, end = start or self.window[0], end or self.window[1]
        return [a for a in self.answers if start <= a.sent + a.latency_ms / 1000 < end]


async def closed_loop(
    url: str,
    images: Sequence[bytes],
    concurrency: int,
    warmup: float,
    seconds: float,
    hooks: dict[str, tuple[float, Callable[[httpx.AsyncClient], Awaitable[Any]]]] | None = None,
) -> Round:
    """``concurrency`` tasks, each posting its next image as soon as its previous answer came; the measured window of
    ``seconds`` opens once ``warmup`` s have passed and the server has answered once (a loaded host's first answer
    may take longer than the warm-up); ``hooks``: name -> (seconds after the window opens, a coroutine run then with
    the client)."""
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    answers: list[Answer] = []
    done: dict[str, tuple[float, Any]] = {}
    answered, opened = asyncio.Event(), asyncio.Event()
    window: list[float] = []
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def open_window() -> None:
            await asyncio.sleep(warmup)
            await answered.wait()
            window.extend([time.time(), time.time() + seconds])
            opened.set()

        async def user(index: int) -> None:
            i = index
            while not window or time.time() < window[1]:
                body = images[i % len(images)]
                i += 1
                sent, clock = time.time(), time.perf_counter()
                try:
                    response = await client.post(url, content=body, headers=JPEG)
                    status, version = response.status_code, response.headers.get("x-model-version")
                except httpx.HTTPError:
                    status, version = 0, None
                answers.append(Answer(sent, (time.perf_counter() - clock) * 1000, status, version))
                answered.set()

        async def hook(name: str, after: float, run: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> None:
            await opened.wait()
            await asyncio.sleep(max(0.0, window[0] + after - time.time()))
            done[name] = (time.time(), await run(client))

        tasks = [open_window(), *(user(i) for i in range(concurrency))]
        tasks += [hook(name, after, run) for name, (after, run) in (hooks or {}).items()]
        await asyncio.gather(*tasks)
    return Round(answers, (window[0], window[1]), done)


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summary(answers: Sequence[Answer], seconds: float) -> dict:
    ok = [a.latency_ms for a in answers if a.status == 200]
    return {
        "answers": len(answers),
        "ok": len(ok),
        "errors": len(answers) - len(ok),
        "error_statuses": dict(Counter(str(a.status) for a in answers if a.status != 200)),
        "requests_per_s": len(ok) / seconds,
        "p50_ms": percentile(ok, 50),
        "p95_ms": percentile(ok, 95),
        "p99_ms": percentile(ok, 99),
    }


# --- batch sizes --------------------------------------------------------------------------------------------------------

BATCH_METRIC = "image_classifier_serve_batch_size"
FORWARD_METRIC = "image_classifier_serve_forward_seconds"


async def scrape_batches(client: httpx.AsyncClient, url: str) -> dict | None:
    """``url``/metrics' batch histogram (``batch_histogram``); None when it could not be read."""
    try:
        return batch_histogram((await client.get(url + "/metrics")).text)
    except httpx.HTTPError:
        return None


def batch_histogram(text: str) -> dict | None:
    """The batch-size histogram in Prometheus text, summed over its labels: {"buckets": {le: cumulative count},
    "sum", "count", and the forward passes' "forward_s" and "forwards"}; None when there is none."""
    from prometheus_client.parser import text_string_to_metric_families

    histogram: dict = {"buckets": Counter(), "sum": 0.0, "count": 0.0, "forward_s": 0.0, "forwards": 0.0}
    found = False
    for family in text_string_to_metric_families(text):
        if family.name == FORWARD_METRIC:
            for sample in family.samples:
                if sample.name.endswith("_sum"):
                    histogram["forward_s"] += sample.value
                elif sample.name.endswith("_count"):
                    histogram["forwards"] += sample.value
        if family.name != BATCH_METRIC:
            continue
        found = True
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                histogram["buckets"][float(sample.labels["le"])] += sample.value
            elif sample.name.endswith("_sum"):
                histogram["sum"] += sample.value
            elif sample.name.endswith("_count"):
                histogram["count"] += sample.value
    return histogram if found else None


def histogram_between(before: dict | None, after: dict | None) -> dict | None:
    """Batches per bucket (not cumulative: "lo-hi" -> count) and the mean batch size between two scrapes."""
    if not after:
        return None
    before = before or {"buckets": {}, "sum": 0.0, "count": 0.0, "forward_s": 0.0, "forwards": 0.0}
    count = after["count"] - before["count"]
    buckets, previous_le, previous = {}, 0.0, 0.0
    for le in sorted(after["buckets"]):
        cumulative = after["buckets"][le] - before["buckets"].get(le, 0.0)
        if cumulative - previous:
            low = int(previous_le) + 1
            high = "inf" if le == float("inf") else int(le)
            buckets[str(low) if low == high else f"{low}-{high}"] = int(cumulative - previous)
        previous_le, previous = le, cumulative
    mean = (after["sum"] - before["sum"]) / count if count else None
    forwards = after["forwards"] - before["forwards"]
    forward_ms = 1000 * (after["forward_s"] - before["forward_s"]) / forwards if forwards else None
    return {
        "batches": int(count),
        "mean": mean,
        "buckets": buckets,
        "forward_ms_mean": forward_ms,
        "source": f"/metrics {BATCH_METRIC}, {FORWARD_METRIC}",
    }


def logged_batches(batch_log: Path, window: tuple[float, float]) -> dict | None:
    """LitClassifier's own record of its batches in the window, by exact size."""
    if not batch_log.is_file():
        return None
    sizes, seconds = [], []
    for line in batch_log.read_text().splitlines():
        when, size, forward = line.split()
        if window[0] <= float(when) < window[1]:
            sizes.append(int(size))
            seconds.append(float(forward))
    counts = Counter(sizes)
    return {
        "batches": len(sizes),
        "mean": sum(sizes) / len(sizes) if sizes else None,
        "buckets": {str(size): counts[size] for size in sorted(counts)},
        "forward_ms_mean": 1000 * sum(seconds) / len(seconds) if seconds else None,
        "source": "LitClassifier.predict's own count and clock",
    }


def batches_text(batches: dict | None) -> str:
    if batches is None:
        return "n/a"
    if not batches["batches"]:
        return "none"
    shown = " ".join(f"{size}:{n}" for size, n in batches["buckets"].items())
    return f"mean {batches['mean']:.1f} ({shown})" if batches["mean"] is not None else shown


# --- the rounds --------------------------------------------------------------------------------------------------------


def cpu_now(server: Server) -> Callable[[httpx.AsyncClient], Awaitable[dict[str, float]]]:
    async def read(client: httpx.AsyncClient) -> dict[str, float]:
        return server.cpu()

    return read


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU-seconds over the window: the server's, the load generator's, and everything else on the machine (other
    people's processes: a figure taken while they were busy is not this server's alone)."""
    used = {k: after[k] - before[k] for k in before}
    return {
        "server": used["server"],
        "client": used["client"],
        "others": max(0.0, used["machine"] - used["server"] - used["client"]),
        "machine": used["machine"],
    }


def levels_at(concurrency: int, kinds: Sequence[str], settings: Settings, images: Sequence[bytes]) -> list[dict]:
    """Fresh servers of ``kinds``, all started; then ``settings.slices`` turns in which each server in turn takes
    ``concurrency`` closed-loop clients for its share of ``settings.seconds`` (after a warm-up: ``--warmup`` the
    first time, 1 s later), so that a drift in the machine's load falls on all of them alike; each server's figures
    pooled over its turns."""
    servers = {kind: make_server(kind, settings, f"c{concurrency}") for kind in kinds}
    turns: dict[str, list[Round]] = {kind: [] for kind in kinds}
    each = settings.seconds / settings.slices
    try:
        ready = {kind: server.start() for kind, server in servers.items()}
        for turn in range(settings.slices):
            for kind, server in servers.items():
                for other in servers.values():  # the others paused: an idle server's wakeups slow the one measured
                    other.pause(other is not server)
                hooks = {"cpu before": (0.0, cpu_now(server)), "cpu after": (each, cpu_now(server))}
                if kind in ("ours", "recording"):
                    hooks["before"] = (0.0, lambda client, url=server.url: scrape_batches(client, url))
                    hooks["after"] = (each, lambda client, url=server.url: scrape_batches(client, url))
                url = server.url + server.predict_path
                warmup = settings.warmup if turn == 0 else min(1.0, settings.warmup)
                turns[kind].append(asyncio.run(closed_loop(url, images, concurrency, warmup, each, hooks)))
        peaks = {kind: server.peak_rss() for kind, server in servers.items()}
    finally:
        for server in servers.values():
            server.pause(False)
            server.stop()
    return [
        pooled(kind, concurrency, turns[kind], servers[kind], peaks[kind], ready[kind], settings.seconds)
        for kind in kinds
    ]


def pooled(
    kind: str,
    concurrency: int,
    turns: list[Round],
    server: Server,
    peaks: dict[int, float],
    ready_s: float,
    seconds: float,
) -> dict:
    """One server's figures over its turns: answers pooled, CPU-seconds and batches summed."""
    figures = summary([a for r in turns for a in r.measured()], seconds)
    used = [cpu_used(r.hooks["cpu before"][1], r.hooks["cpu after"][1]) for r in turns]
    cpu = {k: sum(u[k] for u in used) for k in used[0]}
    if kind in ("ours", "recording"):
        batches = merged([histogram_between(r.hooks["before"][1], r.hooks["after"][1]) for r in turns])
    elif kind == "litserve":
        batches = merged([logged_batches(server.batch_log, r.window) for r in turns])
    else:
        batches = {"batches": figures["ok"], "mean": 1.0, "buckets": {"1": figures["ok"]}, "source": "by construction"}
    return {
        "server": kind,
        "concurrency": concurrency,
        **figures,
        "turns": len(turns),
        "batches": batches,
        "cpu_s": cpu,
        "requests_per_server_cpu_s": figures["ok"] / cpu["server"] if cpu["server"] else None,
        "peak_rss_mb": sum(peaks.values()),
        "peak_rss_mb_per_process": {str(pid): round(mb, 1) for pid, mb in peaks.items()},
        "ready_s": ready_s,
    }


def merged(parts: list[dict | None]) -> dict | None:
    """Batch figures of several windows as one: counts added, means weighted by batches."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    batches = sum(p["batches"] for p in parts)
    buckets: Counter = Counter()
    for p in parts:
        buckets.update(p["buckets"])

    def weighted(key: str) -> float | None:
        known = [p for p in parts if p[key] is not None and p["batches"]]
        total = sum(p["batches"] for p in known)
        return sum(p[key] * p["batches"] for p in known) / total if total else None

    order = sorted(buckets, key=lambda b: float(b.split("-")[0]))
    return {
        "batches": batches,
        "mean": weighted("mean"),
        "buckets": {b: buckets[b] for b in order},
        "forward_ms_mean": weighted("forward_ms_mean"),
        "source": parts[0]["source"],
    }


def swap_round(settings: Settings, images: Sequence[bytes], seconds: float, concurrency: int = 32) -> dict:
    """Ours under ``concurrency`` clients for ``seconds`` after the warm-up; half-way through ``production`` moves
    from version 1 to 2. Errors count every answer of the round; the rest, every request sent after the warm-up
    (those answered after the window's end too: a version-2 answer can come late)."""
    from tasks.registry import set_alias

    set_alias(settings.registry, MODEL_NAME, "production", 1)
    server = make_server("ours", settings, "swap")

    async def move(client: httpx.AsyncClient) -> None:
        await asyncio.to_thread(set_alias, settings.registry, MODEL_NAME, "production", 2)

    try:
        server.start()
        result = asyncio.run(
            closed_loop(
                server.url + server.predict_path,
                images,
                concurrency,
                settings.warmup,
                seconds,
                {"move": (seconds / 2, move)},
            )
        )
        peaks = server.peak_rss()
    finally:
        server.stop()
    moved, start = result.hooks["move"][0], result.window[0]
    sent = [(a.sent + a.latency_ms / 1000, a) for a in result.answers if a.sent >= start]
    old, new = f"{MODEL_NAME}/1", f"{MODEL_NAME}/2"
    first_new = min((t for t, a in sent if a.version == new), default=None)
    last_old = max((t for t, a in sent if a.version == old), default=None)
    switched = max(t for t in (first_new, last_old, moved) if t is not None)
    errors = [a for a in result.answers if a.status != 200]
    return {
        "concurrency": concurrency,
        "seconds": seconds,
        "answers": len(result.answers),
        "errors": len(errors),
        "error_statuses": dict(Counter(str(a.status) for a in errors)),
        "requests_per_s": summary(result.measured(), seconds)["requests_per_s"],
        "p99_ms": summary([a for _, a in sent], seconds)["p99_ms"],
        "p99_before_move_ms": summary([a for t, a in sent if t < moved], seconds)["p99_ms"],
        "around_move": summary([a for t, a in sent if moved <= t <= switched + 2.0], switched + 2.0 - moved),
        "versions": dict(Counter(str(a.version) for _, a in sent)),
        "first_version_2_after_move_s": None if first_new is None else first_new - moved,
        "last_version_1_after_move_s": None if last_old is None else last_old - moved,
        "peak_rss_mb": sum(peaks.values()),
    }


# --- the report ---------------------------------------------------------------------------------------------------------


def number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def levels_table(levels: list[dict]) -> str:
    rows = [
        (
            "server",
            "C",
            "requests/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "errors",
            "batch sizes",
            "forward ms",
            "CPU s server/client/others",
            "requests per server CPU-s",
            "peak RSS MB",
        )
    ]
    for r in levels:
        errors = str(r["errors"]) + (f" {r['error_statuses']}" if r["errors"] else "")
        rows.append(
            (
                r["server"],
                str(r["concurrency"]),
                number(r["requests_per_s"]),
                number(r["p50_ms"]),
                number(r["p95_ms"]),
                number(r["p99_ms"]),
                errors,
                batches_text(r["batches"]),
                number((r["batches"] or {}).get("forward_ms_mean")),
                "/".join(f"{r['cpu_s'][k]:.0f}" for k in ("server", "client", "others")),
                number(r["requests_per_server_cpu_s"]),
                number(r["peak_rss_mb"], 0),
            )
        )
    return aligned(rows)


def swap_text(swap: dict) -> str:
    def after(seconds: float | None) -> str:
        return "never" if seconds is None else f"{seconds:+.2f} s"

    return (
        f"alias swap (ours, concurrency {swap['concurrency']}, {swap['seconds']:g} s, the move half-way): "
        f"{swap['errors']} errors {swap['error_statuses'] or ''}in {swap['answers']} answers (warm-up included); "
        f"{number(swap['requests_per_s'])} requests/s; "
        f"p99 {number(swap['p99_ms'])} ms overall, {number(swap['p99_before_move_ms'])} ms before the move, "
        f"{number(swap['around_move']['p99_ms'])} ms from the move to 2 s after answers switched "
        f"({swap['around_move']['answers']} answers); first version-2 answer {after(swap['first_version_2_after_move_s'])}, "
        f"last version-1 answer {after(swap['last_version_1_after_move_s'])} after the move; "
        f"answers by version {swap['versions']}; peak RSS {number(swap['peak_rss_mb'], 0)} MB"
    )


def goals(
    levels: list[dict], swap: dict | None, ceiling: float | None, at: int = 32, device: str = "cpu"
) -> list[Figure]:
    """Issues 54's and 62's goals, where this run measured what they compare: ours against plain at ``at`` (2x on
    the CPU; 10x on a GPU, where batching pays most); against LitServe at 8, 32 and 64 (throughput and p99); ours at
    ``at`` against the ceiling (one image a request); the recording's cost at ``at``; no error through the swap."""
    times = 2.0 if device == "cpu" else 10.0
    by = {(r["server"], r["concurrency"]): r for r in levels}
    figures = []

    def compare(what: str, ours: dict | None, other: dict | None, target: str, goal: float, p99: bool = False) -> None:
        key = "p99_ms" if p99 else "requests_per_s"
        if ours and other and ours[key] is not None and other[key] is not None:
            unit = "ms" if p99 else "requests/s"
            figures.append(Figure(what, ours[key], other[key], unit, target, goal, higher_is_better=not p99))

    compare(
        f"throughput at C={at}, ours vs plain", by.get(("ours", at)), by.get(("plain", at)), f">= {times:g}x", times
    )
    compare(f"p99 at C={at}, ours vs plain", by.get(("ours", at)), by.get(("plain", at)), "<= 1x", 1.0, p99=True)
    for level in (8, 32, 64):
        ours, lit = by.get(("ours", level)), by.get(("litserve", level))
        compare(f"throughput at C={level}, ours vs LitServe", ours, lit, ">= 1x (no worse)", 1.0)
        compare(f"p99 at C={level}, ours vs LitServe", ours, lit, "<= 1x (no worse)", 1.0, p99=True)
    ours = by.get(("ours", at))
    if ours and ceiling:
        figures.append(
            Figure(
                f"throughput at C={at}, ours vs the ceiling",
                ours["requests_per_s"],
                ceiling,
                "images/s",
                ">= 95% of the ceiling",
                0.95,
                notes="the ceiling: a batch of the same photos decoded then run in turn in one process, best threads",
            )
        )
    compare(f"throughput at C={at}, recording vs not", by.get(("recording", at)), ours, ">= 95%", 0.95)
    if swap:
        figures.append(
            Figure(
                f"errors through the alias swap (C={swap['concurrency']})",
                swap["errors"],
                None,
                "errors",
                "0",
                0.0,
                higher_is_better=False,
            )
        )
    return figures


def ceiling_of(settings: Settings, images: Sequence[bytes], seconds: float) -> tuple[float, int]:
    """What one process does at best with the served model and these photos (bench.inference.ceiling)."""
    from bench.inference import ceiling

    batch = [images[i % len(images)] for i in range(settings.max_batch_size)]
    model = LoadedModel(ModelDirectory(settings.model_dir), device=settings.device, precision=settings.precision)
    return ceiling(model, batch, seconds)


def measure(
    args: argparse.Namespace, kinds: list[str], images: Sequence[bytes]
) -> tuple[list[dict], dict | None, dict, float | None]:
    """The ceiling, every level of every server, then the swap round; (levels, swap, the tail of each server's log,
    the ceiling in images/s)."""
    levels: list[dict] = []
    swap = None
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:
        scratch = Path(scratch)
        registry, model_dir = prepare_registry(scratch)
        settings = Settings(
            args.seconds, args.slices, args.warmup, args.max_batch_size, args.max_wait_ms, args.max_queue, args.poll_s,
            scratch, registry, model_dir, args.device, args.precision,
        )  # fmt: skip
        top = None
        if "ours" in kinds:  # what ours is measured against
            top, threads = ceiling_of(settings, images, seconds=5.0)
            print(
                f"  the ceiling: {top:.1f} images/s (batch {args.max_batch_size}, {threads} torch threads)", flush=True
            )
        try:
            for concurrency in args.concurrency:
                for r in levels_at(concurrency, kinds, settings, images):
                    levels.append(r)
                    print(
                        f"  {r['server']} C={concurrency}: {number(r['requests_per_s'])} requests/s, p99 "
                        f"{number(r['p99_ms'])} ms, {r['errors']} errors, batches {batches_text(r['batches'])}",
                        flush=True,
                    )
            if "ours" in kinds and not args.no_swap:
                swap = swap_round(settings, images, args.swap_seconds)
        except BaseException:
            logs = sorted(scratch.glob("*.log"), key=lambda log: log.stat().st_mtime)
            if logs:
                print(f"the last server's log ({logs[-1].name}):\n{logs[-1].read_text(errors='replace')[-4000:]}")
            raise
        server_logs = {log.name: log.read_text(errors="replace")[-2000:] for log in sorted(scratch.glob("*.log"))}
    return levels, swap, server_logs, top


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="measured seconds per level (default 20)")
    parser.add_argument(
        "--slices", type=int, default=4, help="turns per level: the servers take the load in turn (default 4)"
    )
    parser.add_argument("--warmup", type=float, default=3, help="unmeasured seconds before a server's first turn (3)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=16,
        help="ours and LitServe (default 16, ours' own default: on 2 CPU cores ResNet-18 @224 gives about the same "
        "images/s from a batch of 4 to 32, some 15%% more than one at a time, while a bigger batch holds its first "
        "request longer; a GPU wants more)",
    )
    parser.add_argument("--max-wait-ms", type=float, default=10, help="ours and LitServe's batch_timeout (default 10)")
    parser.add_argument(
        "--max-queue", type=int, default=128, help="ours: images admitted before 503 (default 128, its own; above C)"
    )
    parser.add_argument("--poll-s", type=float, default=0.5, help="ours: how often it reads the alias (default 0.5)")
    parser.add_argument(
        "--device", default="cpu", help="where every server and the ceiling run the model: cpu (default), cuda, cuda:1"
    )
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="every server's: fp32 (default), bf16 (a GPU's)"
    )
    parser.add_argument("--only", nargs="+", choices=SERVERS, help="a subset of the servers (default: all)")
    parser.add_argument("--no-swap", action="store_true", help="leave out the alias-swap round")
    parser.add_argument(
        "--swap-seconds", type=float, default=30, help="the swap round's measured seconds; the move half-way (30)"
    )
    parser.add_argument("--output", type=Path, help="the results file (default bench/results/<date>-serve-<host>.json)")
    parser.add_argument("--plain-server", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--litserve-server", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch-log", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plain_server:
        return run_plain_server(args.plain_server, args.port, args.device, args.precision)
    if args.litserve_server:
        return run_litserve_server(
            args.litserve_server,
            args.port,
            args.batch_log,
            args.max_batch_size,
            args.max_wait_ms,
            args.device,
            args.precision,
        )

    kinds = [k for k in SERVERS if k in (args.only or SERVERS)]
    if "litserve" in kinds and litserve is None:
        print("LitServe is not installed (pip install -e '.[bench]'): left out", file=sys.stderr)
        kinds.remove("litserve")
    from bench.run import machine

    threads = torch.get_num_threads()
    print(
        f"bench.serve: {', '.join(kinds)} at concurrency {args.concurrency}, {args.warmup:g} s warm-up + "
        f"{args.seconds:g} s each; max batch {args.max_batch_size}, max wait {args.max_wait_ms:g} ms, "
        f"max queue {args.max_queue}; {args.device}, {args.precision}; torch threads {threads} (torch's default here, "
        "left to each server)",
        flush=True,
    )
    images = photos()
    load_before = os.getloadavg()
    # A SIGTERM ends the run as Ctrl-C does: the finally blocks stop every server started.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        levels, swap, server_logs, top = measure(args, kinds, images)
    finally:
        signal.signal(signal.SIGTERM, previous)
    figures = goals(levels, swap, top, device=args.device)
    print()
    print(levels_table(levels))
    if swap:
        print(swap_text(swap))
    if figures:
        print()
        print(table(figures))
    now = datetime.now(timezone.utc)
    out = args.output or RESULTS / f"{now:%Y-%m-%d}-serve-{socket.gethostname()}.json"
    record = {
        "date": now.isoformat(),
        "machine": machine(),
        "command": [Path(sys.executable).name, "-m", "bench.serve", *(argv if argv is not None else sys.argv[1:])],
        "settings": {
            "servers": kinds,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "slices": args.slices,
            "warmup": args.warmup,
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "max_queue": args.max_queue,
            "poll_s": args.poll_s,
            "device": args.device,
            "precision": args.precision,
            "swap_seconds": None if args.no_swap else args.swap_seconds,
            "torch_threads": threads,
            "images": len(images),
            "model": "resnet18 @224 px, random weights, 10 classes",
            "peak_rss": "VmHWM summed over the server's process group, a fresh set of servers per level",
        },
        "ceiling_images_per_s": top,
        "levels": levels,
        "swap": swap,
        "load_average": {"start": load_before, "end": os.getloadavg()},  # the machine's, others' work included
        "figures": [f.as_dict() for f in figures],
        "server_log_tails": server_logs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
