"""Registrations racing each other, on local disk (processes) and on the real HTTP S3 endpoint (threads),
through a proxy that fails a fifth of the requests, each promoting itself if it beats the champion; and a
registration killed in the middle of an upload."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from deployments.local import PROJECT_ROOT
from tasks.contracts.model_directory import MODEL_FILES, WEIGHTS_FILE, ModelDirectory
from tasks.registry import (
    CLAIM_FILE,
    REGISTRATION_FILE,
    PromotionPolicy,
    fetch_model,
    list_versions,
    open_backend,
    read_registration,
    register_model,
    resolve,
)
from tasks.storage.local_files import sha256_file
from tests.faulty_proxy import FaultyProxy
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

NAME = "race-resnet18"
WORKERS = 8


@pytest.fixture(scope="module")
def distinct_models(trained_model, tmp_path_factory) -> list[Path]:
    """Eight ModelDirectories whose weights all differ, so that a file landing in the wrong version shows."""
    base = tmp_path_factory.mktemp("distinct")
    state = torch.load(trained_model / WEIGHTS_FILE, weights_only=True)
    models = []
    for worker in range(WORKERS):
        folder = shutil.copytree(trained_model, base / f"model-{worker}", ignore=shutil.ignore_patterns("checkpoints"))
        torch.save({**state, "fc.bias": state["fc.bias"] + worker}, folder / WEIGHTS_FILE)
        models.append(folder)
    return models


def register_as(
    registry: str, model: Path, worker: int, start: threading.Barrier | None = None, promote: str | None = None
) -> int:
    if start is not None:
        start.wait()
    registration, _ = register_model(
        registry,
        NAME,
        ModelDirectory(model),
        metrics={"accuracy": worker / 10},
        params={},
        datasets={},
        tags={"worker": str(worker)},
        promotion=PromotionPolicy(promote_to=promote),
    )
    return registration.version


# A registration in a fresh interpreter: it waits for the file ``go`` (when given) so that all start at once.
REGISTER = """
import pathlib, sys, time
from tasks.contracts.model_directory import ModelDirectory
from tasks.registry import PromotionPolicy, register_model, resolve
registry, name, model, worker, go, promote = sys.argv[1:7]
if go:
    pathlib.Path(f"{go}.ready-{worker}").touch()
    while not pathlib.Path(go).exists():
        time.sleep(0.001)
registration, _ = register_model(registry, name, ModelDirectory(model), metrics={"accuracy": int(worker) / 10},
                                 params={}, datasets={}, tags={"worker": worker},
                                 promotion=PromotionPolicy(promote_to=promote or None))
print(registration.version)
"""


def start_registration(
    registry: str, model: Path, worker: int, go: Path | None = None, env: dict | None = None, promote: str = ""
):
    command = [sys.executable, "-c", REGISTER, registry, NAME, str(model), str(worker), str(go or ""), promote]
    return subprocess.Popen(
        command,
        cwd=PROJECT_ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def check_every_version_holds_its_own_files(registry: str, models: list[Path], cache: Path) -> None:
    assert list_versions(registry, NAME) == list(range(1, WORKERS + 1))
    workers = set()
    for version in range(1, WORKERS + 1):
        record = read_registration(registry, NAME, version)
        worker = int(record.tags["worker"])
        workers.add(worker)
        assert record.metrics == {"accuracy": worker / 10}
        stored = fetch_model(registry, f"{NAME}/{version}", cache)  # downloads verify each sha256 on S3
        for file_name in MODEL_FILES:
            assert (
                record.files[file_name]
                == sha256_file(models[worker] / file_name)
                == sha256_file(stored.root / file_name)
            )
    assert workers == set(range(WORKERS)), "each registration landed exactly once"


def check_alias_on_the_best(registry: str) -> None:
    """Every registration promoted itself if it beat the champion: the alias ends on accuracy 0.7, worker 7."""
    champion = resolve(registry, f"{NAME}@production")
    assert champion.tags["worker"] == str(WORKERS - 1), f"alias ended on worker {champion.tags['worker']}"


@pytest.mark.parametrize("promote", ["", "production"])
def test_eight_processes_registering_at_once_get_eight_versions_on_disk(distinct_models, tmp_path, promote):
    registry, go = str(tmp_path / "registry"), tmp_path / "go"
    processes = [
        start_registration(registry, model, worker, go, promote=promote) for worker, model in enumerate(distinct_models)
    ]
    with contextlib.suppress(AssertionError):  # all started, or 120 s passed: they go
        wait_for(lambda: len(list(tmp_path.glob("go.ready-*"))) >= WORKERS, 120, interval=0.05, what="all ready")
    go.touch()
    outcomes = [process.communicate(timeout=120) for process in processes]
    assert all(p.returncode == 0 for p in processes), [err for _, err in outcomes]
    assert sorted(int(out) for out, _ in outcomes) == list(range(1, WORKERS + 1))
    check_every_version_holds_its_own_files(registry, distinct_models, tmp_path / "cache")
    if promote:
        check_alias_on_the_best(registry)


def test_eight_registrations_through_a_failing_s3_endpoint_all_land(
    distinct_models, s3_endpoint, s3_bucket, tmp_path, monkeypatch
):
    registry = f"s3://{s3_bucket}/models"
    with FaultyProxy(s3_endpoint, failure_rate=0.2, seed=5) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        start = threading.Barrier(WORKERS)
        with ThreadPoolExecutor(WORKERS) as pool:
            versions = list(
                pool.map(lambda w: register_as(registry, distinct_models[w], w, start, "production"), range(WORKERS))
            )
    assert sorted(versions) == list(range(1, WORKERS + 1))
    assert proxy.counts["before"] > 0 and proxy.counts["after"] > 0, proxy.counts
    print(f"proxy: {dict(proxy.counts)}")

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    check_every_version_holds_its_own_files(registry, distinct_models, tmp_path / "cache")
    check_alias_on_the_best(registry)


def test_registration_killed_during_upload_leaves_no_version(trained_model, s3_endpoint, s3_bucket, tmp_path):
    registry = f"s3://{s3_bucket}/models"
    with FaultyProxy(s3_endpoint, failure_rate=0.0, hold_suffix=f"/{WEIGHTS_FILE}", lifetime_s=120) as proxy:
        child = start_registration(registry, trained_model, 0, env={"AWS_ENDPOINT_URL": proxy.url})
        try:
            assert proxy.held.wait(timeout=90), "the registration never started uploading its weights"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)

    backend = open_backend(registry)
    assert backend.read(f"{NAME}/1/{CLAIM_FILE}") is not None, "the killed registration had claimed version 1"
    assert backend.read(f"{NAME}/1/{REGISTRATION_FILE}") is None and backend.read(f"{NAME}/1/{WEIGHTS_FILE}") is None
    assert list_versions(registry, NAME) == []

    registration, _ = register_model(registry, NAME, ModelDirectory(trained_model), metrics={}, params={}, datasets={})
    assert registration.version == 2 and list_versions(registry, NAME) == [2]


def test_flows_fetching_one_version_at_once_share_one_complete_copy(trained_model, s3_bucket, tmp_path):
    registry = f"s3://{s3_bucket}/models"
    register_model(registry, NAME, ModelDirectory(trained_model), metrics={}, params={}, datasets={})
    start = threading.Barrier(4)

    def fetch(_):
        start.wait()
        return fetch_model(registry, NAME, tmp_path / "cache").root

    with ThreadPoolExecutor(4) as pool:
        folders = set(pool.map(fetch, range(4)))
    assert folders == {tmp_path / "cache" / NAME / "1"}
    for file_name in MODEL_FILES:
        assert sha256_file(tmp_path / "cache" / NAME / "1" / file_name) == sha256_file(trained_model / file_name)
    assert sorted(p.name for p in (tmp_path / "cache" / NAME).iterdir()) == ["1"], "no download folder left behind"
