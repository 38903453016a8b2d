"""Helpers the tests share: small real images, the processes a training started, what a flow run published,
the registry command line. Fixtures live in conftest.py."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from PIL import Image
from prefect.client.orchestration import get_client

from tasks.contracts.image_directory import EXIF_ORIENTATION
from tasks.contracts.model_directory import ModelDirectory
from tasks.registry import DatasetLineage, register_model

NAME = "colours-resnet18"  # the registered name of the colours model the registry tests use
LINEAGE = {"train": DatasetLineage(source="/data/train", content_hash="ab" * 32, images=24)}

# Colours far apart, so that a couple of epochs on a dozen images learn them.
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def write_image(path: Path, rgb: tuple[int, int, int], size: int = 16, seed: int = 0, fmt: str | None = None) -> Path:
    """A real image file: a solid colour with noise, so no two files are equal."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(rgb)[None, None, :] + rng.integers(-25, 25, (size, size, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode="RGB").save(path, format=fmt)
    return path


def sample_photos() -> dict[str, Image.Image]:
    """Three real photographs that ship with the installed packages: scikit-learn's two sample images (a temple
    in China, a flower; 640x427) and matplotlib's portrait of Grace Hopper (512x600)."""
    import matplotlib
    from sklearn.datasets import load_sample_images

    photos = {name: Image.fromarray(pixels) for name, pixels in zip(("china", "flower"), load_sample_images().images)}
    with Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg") as hopper:
        photos["hopper"] = hopper.convert("RGB")
    return photos


def write_burst(folder: Path, name: str, photo: Image.Image) -> list[str]:
    """A photo and its near-duplicates as a camera roll gathers them: the photo (JPEG), a copy resized to half
    (PNG) and that copy re-compressed (JPEG quality 40); their names (relative to ``folder``'s parent)."""
    folder.mkdir(parents=True, exist_ok=True)
    half = photo.resize((photo.width // 2, photo.height // 2), Image.Resampling.LANCZOS)
    photo.save(folder / f"{name}.jpg", quality=90)
    half.save(folder / f"{name}_half.png")
    half.save(folder / f"{name}_half_q40.jpg", quality=40)
    return [f"{folder.name}/{name}{end}" for end in (".jpg", "_half.png", "_half_q40.jpg")]


def write_crops(folder: Path, name: str, photo: Image.Image) -> list[str]:
    """Four different pictures cut from one photo (its left, right, top and bottom halves), as JPEGs; their
    names (relative to ``folder``'s parent). Their perceptual hashes are 20 or more bits apart."""
    folder.mkdir(parents=True, exist_ok=True)
    w, h = photo.size
    boxes = {
        "left": (0, 0, w // 2, h),
        "right": (w // 2, 0, w, h),
        "top": (0, 0, w, h // 2),
        "bottom": (0, h // 2, w, h),
    }
    for part, box in boxes.items():
        photo.crop(box).save(folder / f"{name}_{part}.jpg", quality=90)
    return [f"{folder.name}/{name}_{part}.jpg" for part in boxes]


def orientation_exif(orientation: int) -> bytes:
    """EXIF holding only an Orientation tag, to save with an image (``exif=``) as a phone saves a photo."""
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = orientation
    return exif.tobytes()


def write_phone_photos(root: Path, width: int = 64, height: int = 48) -> list[Path]:
    """JPEGs as a phone stores them: the pixels as the sensor read them and an EXIF Orientation tag (1-8, one
    file each) that viewers turn them by. The picture is lopsided (a dark left half, a top-to-bottom ramp), so a
    wrong turn or flip is far from the right one."""
    root.mkdir(parents=True, exist_ok=True)
    rows = np.linspace(30, 220, height, dtype=np.float32)[:, None]
    pixels = np.repeat(rows, width, axis=1)
    pixels[:, : width // 2] *= 0.3
    rgb = np.stack([pixels, np.full_like(pixels, 90), 255 - pixels], axis=2).astype(np.uint8)
    paths = []
    for orientation in range(1, 9):
        paths.append(root / f"orientation-{orientation}.jpg")
        Image.fromarray(rgb).save(paths[-1], quality=95, exif=orientation_exif(orientation))
    return paths


def write_class_folders(root: Path, per_class: int, classes=tuple(COLOURS), seed: int = 0, ext: str = ".png") -> Path:
    for c, name in enumerate(classes):
        for i in range(per_class):
            write_image(root / name / f"{name}_{i}{ext}", COLOURS[name], seed=seed * 1000 + c * 100 + i)
    return root


def run_worker(*args: str, processes: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """A real torchrun launch of the training worker (Gloo on CPU)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
        "-m",
        "tasks.training.worker",
        *args,
    ]
    return subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    )


def wait_for(condition: Callable, timeout: float = 120, what: str | Callable[[], str] = "condition", interval=0.1):
    """``condition()``'s first true value, asked every ``interval`` s: the one deadline loop of the tests. After
    ``timeout`` s an AssertionError "timed out after <timeout> s waiting for <what>"; ``what`` may be a function,
    called only then (a log's tail, the states seen last). ``condition`` may raise to stop the wait early."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)
    return value


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def processes_of(output: Path) -> list[int]:
    """Every process (torchrun, its wrapper, the workers) whose command line names ``output``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and str(output).encode() in argv and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        if not entry.name.isdigit():
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending += children.get(pid, [])
    return tree


def lose(pids) -> None:
    """``pids`` stop at once, as on a host that loses power: each stopped first, so that none sees another die and
    cleans up, then killed."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def lose_host_of(flow_run) -> None:
    """The host of a running flow run lost: the process its worker started for it and everything below, at once
    (its worker, as a pool's other host would, then reports the run Crashed)."""
    lose(process_tree(int(flow_run.infrastructure_pid.rsplit(":", 1)[-1])))


def flow_run_log(api_url: str, flow_run_id) -> str:
    """A flow run's log lines, as the UI shows them."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(entry.message for entry in logs)


def heartbeats_of(api_url: str, flow_run_id, auth: str | None = None) -> int:
    """How many heartbeat events the server has from a flow run (``auth``: the basic-auth string of a secured
    server)."""
    from prefect.client.orchestration import SyncPrefectClient

    with SyncPrefectClient(api_url, auth_string=auth) as client:
        response = client._client.post(
            "/events/filter",
            json={
                "filter": {
                    "event": {"name": ["prefect.flow-run.heartbeat"]},
                    "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]},
                }
            },
        )
        return response.json()["total"]


def training_processes(folder: Path) -> dict[int, list[str]]:
    """The living training processes (the launcher's wrapper, torchrun, the workers) writing below ``folder``: their
    command lines, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, UnicodeDecodeError):
            continue
        if entry.name.isdigit() and "tasks.training.worker" in argv and any(a.startswith(str(folder)) for a in argv):
            if alive(int(entry.name)):
                found[int(entry.name)] = argv
    return found


def worker_pids(output: Path) -> list[int]:
    """PIDs of the worker processes (not the torchrun agent) training into ``output``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tasks.training.worker" in argv and str(output).encode() in argv and b"torch.distributed.run" not in argv:
            pids.append(int(entry.name))
    return pids


async def artifacts_and_task_runs(flow_run_id):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
        task_runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return artifacts, task_runs


async def progress_artifacts(task_run_id):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterTaskRunId, ArtifactFilterType

    async with get_client() as client:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id]), type=ArtifactFilterType(any_=["progress"])
            )
        )


async def artifacts_and_run_count(flow_run_id, task_run_id) -> tuple[dict[str, str], int]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, TaskRunFilter
    from prefect.client.schemas.sorting import ArtifactSort

    # Every filter spelled out: this server answers 422 to the nulls the client sends for the ones left out.
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])),
            flow_run_filter=FlowRunFilter(),
            task_run_filter=TaskRunFilter(),
            limit=10,
            sort=ArtifactSort.CREATED_DESC,
        )
        task_run = await client.read_task_run(task_run_id)
    return {a.key: str(a.data) for a in artifacts}, task_run.run_count


async def card_versions(key):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        artifacts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return sorted(artifacts, key=lambda a: a.created)


def main_in_process(main, argv: list[str]) -> subprocess.CompletedProcess:
    """A command line's ``main(argv)`` run in this process, as from a shell without PREFECT_API_URL (whichever server
    an earlier test of this process pointed at): its exit status and what it printed. A new Python per command costs
    more than the command; what only a new process shows (the console a user sees, the environment read at start)
    is asserted by the tests that run one."""
    import contextlib
    import io

    from prefect.settings import PREFECT_API_URL, temporary_settings

    out, err = io.StringIO(), io.StringIO()
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as exit:  # argparse's refusals and the one-line mistakes
                status = exit.code
    return subprocess.CompletedProcess(argv, status, out.getvalue(), err.getvalue())


def registry_cli(registry, *args, env=None, in_process=None) -> subprocess.CompletedProcess:
    """``python -m flows.registry --registry <registry> <args>``: in this process (``main_in_process``) unless ``env``
    is given or ``in_process`` is False."""
    command = ["--registry", str(registry), *args]
    if in_process is False or (in_process is None and env):
        return subprocess.run(
            [sys.executable, "-m", "flows.registry", *command],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=120,
        )
    from flows.registry import main

    return main_in_process(main, command)


def s3_settings(endpoint: str) -> dict[str, str]:
    """The environment that points boto3 at the loopback S3 endpoint, with the test credentials it takes."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


@contextlib.contextmanager
def s3_test_bucket(prefix: str = "bucket") -> Iterator[str]:
    """A new bucket on the endpoint that ``AWS_ENDPOINT_URL`` names, emptied and deleted when the block ends. The
    tests' moto server keeps every object's bytes in a temporary file until its key is deleted: a run whose buckets
    stayed held 4.2 GB at 60% of the suite, and filled a CI host's disk."""
    from tasks.storage.s3 import s3_client

    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    client = s3_client()
    client.create_bucket(Bucket=name)
    try:
        yield name
    finally:
        delete_bucket(client, name)


def delete_bucket(client, name: str, tries: int = 5) -> None:
    """Deletes every version, delete marker and unfinished upload in bucket ``name``, then the bucket; again while
    something still writes into it (a flow run that outlived its test), ``tries`` times."""
    from botocore.exceptions import ClientError

    for attempt in range(tries):
        for page in client.get_paginator("list_object_versions").paginate(Bucket=name):
            found = [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
            if found:
                objects = [{"Key": o["Key"], "VersionId": o["VersionId"]} for o in found]
                client.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})
        for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
        try:
            client.delete_bucket(Bucket=name)
            return
        except ClientError as error:
            if error.response["Error"]["Code"] != "BucketNotEmpty" or attempt == tries - 1:
                raise
            time.sleep(1)


def register_test_model(registry, model, name=NAME, accuracy=0.9, **promotion):
    """A registration by its own task run of flow run ``run-1``; ``promotion``: PromotionPolicy's fields."""
    from tasks.registry import PromotionPolicy

    return register_model(
        registry,
        name,
        ModelDirectory(model),
        metrics={"accuracy": accuracy},
        params={"epochs": 2},
        datasets=LINEAGE,
        flow_run_id="run-1",
        task_run_id=uuid.uuid4().hex,
        tags={"team": "vision"},
        promotion=PromotionPolicy(**promotion) if promotion else None,
    )


class FileServer(http.server.ThreadingHTTPServer):
    """Serves ``files`` (URL path -> bytes) on loopback and records every request's path."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    def __enter__(self) -> FileServer:
        """Serving, in a thread of its own, until the ``with`` block ends."""
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()
        super().__exit__(*exc_info)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        body = self.server.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args) -> None:
        pass


def pipeline_command(train, validation, name: str, work, *flags: str, module: str = "flows.pipeline") -> list[str]:
    """`python -m flows.pipeline` (or ``module``: flows.sweep) on real folders, trained from scratch, its registry
    and runs under ``work`` (a folder or an S3 URI); ``flags`` add to or override these."""
    return [
        sys.executable,
        "-m",
        module,
        "--no-pretrained",
        "--train-data",
        str(train),
        "--validation-data",
        str(validation),
        "--model-name",
        name,
        "--registry",
        f"{work}/registry",
        "--work-dir",
        f"{work}/runs",
        *flags,
    ]


def register_colours(registry: str, name: str, trained_model, colour_image_dirs, figures: dict, promotion):
    """The register task (inside a flow run) for the shared colours model with ``figures``, as the pipeline calls it."""
    from tasks.registry.prefect_tasks import register

    train, val = colour_image_dirs
    datasets = {"train": str(train), "validation": str(val)}
    return register(registry, name, str(trained_model), figures, datasets, {"epochs": 2}, promotion=promotion)
