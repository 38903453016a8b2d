"""Fixtures that write small real images, and a real (temporary) Prefect server for flow tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from deployments.local import free_port  # noqa: E402

# Colours far apart, so that a couple of epochs on a dozen images learn them.
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}


def write_image(path: Path, rgb: tuple[int, int, int], size: int = 16, seed: int = 0, fmt: str | None = None) -> Path:
    """A real image file: a solid colour with noise, so no two files are equal."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(rgb)[None, None, :] + rng.integers(-25, 25, (size, size, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode="RGB").save(path, format=fmt)
    return path


def write_class_folders(root: Path, per_class: int, classes=tuple(COLOURS), seed: int = 0, ext: str = ".png") -> Path:
    for c, name in enumerate(classes):
        for i in range(per_class):
            write_image(root / name / f"{name}_{i}{ext}", COLOURS[name], seed=seed * 1000 + c * 100 + i)
    return root


def run_worker(*args: str, processes: int = 2, env: dict | None = None) -> subprocess.CompletedProcess:
    """A real torchrun launch of the training worker (Gloo on CPU)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "-m", "tasks.training.worker", *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


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


@pytest.fixture
def colour_source(tmp_path: Path) -> Path:
    """A class-per-folder source: 3 colour classes x 6 PNG images."""
    return write_class_folders(tmp_path / "source", per_class=6)


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """Temporary folders (archive extraction, downloads) inside tmp_path, so that anything written outside
    them is seen by the test."""
    import tempfile

    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture(scope="session")
def colour_image_dirs(tmp_path_factory) -> tuple[Path, Path]:
    """Converted (train, validation) ImageDirectories of the colour classes."""
    from tasks import convert_to_image_directory

    base = tmp_path_factory.mktemp("colours")
    train = convert_to_image_directory(write_class_folders(base / "src-train", 8, seed=1), base / "train").root
    val = convert_to_image_directory(write_class_folders(base / "src-val", 4, seed=2), base / "validation").root
    return train, val


@pytest.fixture(scope="session")
def resnet_spec(tmp_path_factory) -> Path:
    from tasks.model import write_untrained_model_directory
    from tasks.model_directory import ModelSpec

    return write_untrained_model_directory(tmp_path_factory.mktemp("spec"), ModelSpec(architecture="resnet18"))


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory, colour_image_dirs, resnet_spec) -> Path:
    """A ModelDirectory trained for real by torchrun with 2 processes (2 epochs)."""
    train, val = colour_image_dirs
    output = tmp_path_factory.mktemp("trained") / "model"
    result = run_worker("--train", str(train), "--validation", str(val), "--model-spec", str(resnet_spec),
                        "--output", str(output), "--epochs", "2", "--learning-rate", "0.01", "--batch-size", "4")  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return output


@pytest.fixture(scope="session")
def digits_subset(tmp_path_factory) -> tuple[Path, Path]:
    """The bundled digits, cut to 30 training and 10 validation images per class."""
    from tasks.datasets import export_digits

    base = tmp_path_factory.mktemp("digits")
    train, val = export_digits(base / "full")
    subsets = []
    for split, keep in ((train, 30), (val, 10)):
        target = base / "digits" / split.name
        for class_dir in sorted(split.iterdir()):
            for image in sorted(class_dir.iterdir())[:keep]:
                (target / class_dir.name).mkdir(parents=True, exist_ok=True)
                shutil.copy(image, target / class_dir.name / image.name)
        subsets.append(target)
    return subsets[0], subsets[1]


@pytest.fixture(scope="session")
def digits_image_dirs(tmp_path_factory, digits_subset) -> tuple[Path, Path]:
    """The digits subset converted: 300 training and 100 validation ImageDirectory images."""
    from tasks import convert_to_image_directory

    base = tmp_path_factory.mktemp("digits-converted")
    train, val = digits_subset
    return convert_to_image_directory(train, base / "train").root, convert_to_image_directory(val, base / "val").root


@pytest.fixture(scope="session")
def prefect_server():
    """A real Prefect server on a temporary SQLite database, for the flow tests."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real HTTP S3 endpoint on loopback: moto's server mode in its own process (not in-process patching)."""
    import time
    import urllib.request

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError(f"moto server did not start on {url}")
            time.sleep(0.2)
    yield url
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch):
    """An empty bucket on the loopback endpoint, with AWS_ENDPOINT_URL and test credentials set."""
    import uuid

    from tasks.storage import s3_client

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = f"bucket-{uuid.uuid4().hex[:12]}"
    s3_client().create_bucket(Bucket=name)
    return name
