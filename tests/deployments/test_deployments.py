"""Deployments on the real path, as a team sets them up: a Prefect server on PostgreSQL and on the network (basic
auth on, its secret in a 0600 file), `make deploy`, two `make worker`s on the `gpu` pool, `make serve`; a training
run of your own photos (one folder split, fetched weights, a killed torchrun worker, the promotion approved in the
UI) that leaves no secret anywhere; and, last, a host lost mid-training: its run set Crashed by `make deploy`'s
automation and resumed on the other host."""

import asyncio
import hashlib
import http.server
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

from deployments.auth import AUTH_FILE, CLIENT_AUTH, read_secret
from deployments.automations import (
    HEARTBEAT_SETTING,
    MISSED_HEARTBEATS,
    RERUN_AUTOMATION,
    ZOMBIE_AUTOMATION,
    ensure_zombie_automation,
    heartbeat_seconds,
)
from deployments.local import PROJECT_ROOT, PrefectStack, free_port
from deployments.postgres import Cluster
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.training_config import TrainingParams
from tasks.contracts.transformations import RandomRotation
from tasks.evaluation.score import score_images
from tasks.launch.torchrun_output import read_metrics
from tasks.outages import RIDE_OUT_SERVER_RESTART, RUN_HEARTBEAT_S, heartbeat_tag
from tasks.registry import fetch_model, list_versions, read_registration, resolve
from tasks.registry.manage import show_version
from tasks.storage.runs import folder_size
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE
from tests.browser import (
    chromium,
    click_text,
    field,
    latest_artifact_id,
    paused_run_id,
    table_overflow,
    wait_for_text,
)
from tests.helpers import (
    FileServer,
    artifacts_and_task_runs,
    delete_bucket,
    flow_run_log,
    heartbeats_of,
    lose,
    process_tree,
    progress_artifacts,
    s3_settings,
    training_processes,
    wait_for,
    worker_pids,
)

pytestmark = pytest.mark.integration

DEPLOYMENT_FILE = PROJECT_ROOT / "deployments" / "prefect.yaml"
SHOTS = PROJECT_ROOT / "build" / "ui-check"
MODEL = "digits-resnet18"  # the finished run's: one folder named digits, a ResNet-18
# One folder given: its conversion and the split stand where two folders' conversions (train-images,
# validation-images: `make run`, tests/test_docs_commands.py) would.
STAGE_ARTIFACTS = {
    "source-images",
    "split",
    "label-validation",
    "model-spec",
    "training-progress",
    "training-metrics",
    "training-curves",
    "scores",
    "evaluation",
    "confusion-matrix",
    "registered-model",
    "onnx-export",
    "promotion",
    "misclassified-images",
    f"model-card-{MODEL}",
}


def test_every_deployment_names_a_real_flow_with_valid_parameters(monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    config = yaml.safe_load(DEPLOYMENT_FILE.read_text())
    assert config["deployments"]
    for deployment in config["deployments"]:
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        if "parameters" in deployment:  # train-node has none: the train stage gives each of its runs every one
            flow.validate_parameters(deployment["parameters"])
        for schedule in deployment.get("schedules", []):
            assert schedule["timezone"] and schedule["cron"]


WORKERS = ("gpu-a", "gpu-b")


def make(stack, target: str, **variables: str) -> None:
    """``make <target>`` against the stack's server, waited for."""
    process = stack.make(target, target, **variables)
    assert process.wait(timeout=300) == 0, (stack.logs / f"{target}.log").read_text()


@pytest.fixture(scope="module")
def stack(prefect_home, tmp_path_factory, s3_endpoint):
    """As a team sets it up: `make postgres` (a cluster of its own, on a free port), `make server DB=postgresql
    HOST=0.0.0.0` on a free port (basic auth on: the secret created in a 0600 file; its scheduler looking every
    second), `make deploy`, two `make worker`s on `gpu` (two hosts: a cache of its own each), and `make serve`;
    `make deploy`, the workers and serve find the secret in the file. Every process reaches the loopback S3
    endpoint with a secret key planted for the test; the workers' environment holds a planted database password."""
    import tempfile

    config = tmp_path_factory.mktemp("config")
    settings = {
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
        "IMAGE_CLASSIFIER_CONFIG": str(config),  # no secret of this machine's user: created there by make server
        "OMP_NUM_THREADS": "1",
        "TORCH_HOME": str(tmp_path_factory.mktemp("torch")),  # pretrained weights fetched into a cache of the test
        "no_proxy": "127.0.0.1,localhost",  # the weights mirror is on loopback
        **s3_settings(s3_endpoint),
        "AWS_SECRET_ACCESS_KEY": f"planted-s3-{uuid.uuid4().hex}",  # the loopback endpoint takes any
    }
    planted_database = f"postgresql+asyncpg://prefect:planted-db-{uuid.uuid4().hex}@db/p"
    # Not under pytest's folders: as root, the cluster runs as the postgres user, who cannot reach them.
    cluster = Path(tempfile.mkdtemp(prefix="image-classifier-test-make-pg-"))
    postgres = {"POSTGRES_DIR": str(cluster), "POSTGRES_PORT": str(free_port())}
    home = prefect_home("prefect-home")
    running = PrefectStack(
        home=home,
        settings=settings,
        make_server=True,
        server_variables={"DB": "postgresql", "HOST": "0.0.0.0", **postgres},
    )
    running.postgres = postgres
    try:
        make(running, "postgres", **postgres)
        with running, pytest.MonkeyPatch.context() as patch:
            for variable in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
                patch.setenv(variable, settings[variable])  # the tests read the stack's S3 as its processes do
            running.auth_file = config / AUTH_FILE
            running.auth = read_secret(running.auth_file)
            make(running, "deploy")
            running.caches = {name: tmp_path_factory.mktemp(f"{name}-cache") for name in WORKERS}
            worker_env = {**running.env, "PREFECT_SERVER_DATABASE_CONNECTION_URL": planted_database}
            running.workers = {
                name: running.make(
                    name,
                    "worker",
                    env={**worker_env, CACHE_VARIABLE: str(running.caches[name])},
                    POOL="gpu",
                    WORKER_NAME=name,
                )
                for name in WORKERS
            }
            running.make("serve", "serve")
            running.secrets = {
                "the API's password": running.auth.split(":", 1)[1],
                "the S3 secret key": settings["AWS_SECRET_ACCESS_KEY"],
                "the planted database password": planted_database.split(":")[2].split("@")[0],
                "the PostgreSQL password": read_secret(Cluster(cluster).password_file),
            }
            yield running
    finally:
        make(running, "postgres-stop", **postgres)
        shutil.rmtree(cluster, ignore_errors=True)


def worker_that_ran(stack, run) -> list[str]:
    """The workers that started ``run`` (another one may have tried, and been told it was taken)."""
    started = f"Flow run '{run.name}' submitted to infrastructure"
    return [name for name in WORKERS if started in (stack.logs / f"{name}.log").read_text()]


async def read_deployment_and_artifacts(stack, run):
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with PrefectClient(stack.api_url, auth_string=stack.auth) as client:
        deployment = await client.read_deployment(run.deployment_id)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    return deployment, {a.key for a in artifacts}


def run_deployment(stack, parameters: dict, name: str, *options: str) -> str:
    """Trigger a run of a deployment from the shell (the secret given in the environment), with `prefect deployment
    run`'s ``options`` (e.g. ``--start-in``); returns its id."""
    params = json.dumps(parameters)
    result = stack.cli("deployment", "run", name, "--params", params, *options, env={CLIENT_AUTH: stack.auth})
    return next(line.split()[-1] for line in result.stdout.splitlines() if "UUID:" in line)


def queue_runs_at_once(stack, parameters: list[dict], name="train-pipeline/retrain-digits") -> list[str]:
    """Runs of a deployment all due at the same moment, a few seconds from now, as a schedule makes them."""
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    async def create():
        async with get_client() as client:
            deployment = await client.read_deployment_by_name(name)
            due = datetime.now(timezone.utc) + timedelta(seconds=5)
            new_run = client.create_flow_run_from_deployment
            runs = [await new_run(deployment.id, parameters=p, state=Scheduled(scheduled_time=due)) for p in parameters]
        return [str(r.id) for r in runs]

    with temporary_settings_for(stack):
        return asyncio.run(create())


def wait_for_deployment(stack, name, timeout=120):
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    def read(client):
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            return None

    with temporary_settings_for(stack), get_client(sync_client=True) as client:
        return wait_for(
            lambda: read(client), timeout, interval=1, what=lambda: f"{name} to appear:\n{stack.log_text()[-3000:]}"
        )


def temporary_settings_for(stack):
    """Prefect's settings for a client of the stack's server: its address and its basic-auth string."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    return temporary_settings({PREFECT_API_URL: stack.api_url, PREFECT_API_AUTH_STRING: stack.auth})


def wait_for_runs(stack, flow_run_ids, timeout=400) -> list:
    """The flow runs, once every one has ended (their states and the stack's log in the error after ``timeout`` s)."""
    from prefect.client.orchestration import SyncPrefectClient

    seen = []

    def ended():
        seen[:] = [client.read_flow_run(i) for i in flow_run_ids]
        return list(seen) if all(r.state.is_final() for r in seen) else None

    with SyncPrefectClient(stack.api_url, auth_string=stack.auth) as client:
        return wait_for(
            ended,
            timeout,
            interval=1,
            what=lambda: f"runs to end: {[(r.name, r.state) for r in seen]}\n{stack.log_text()[-3000:]}",
        )


class FinishedRun(NamedTuple):
    """What the one deployment run did, recorded as it happened; each test below asserts one part of it, so that
    one failure fails the test of that behaviour alone."""

    run: object  # the flow run, as the server has it once --watch ended
    registry: str
    runs: Path  # the work dir
    watched: str  # what --watch printed
    watch_exit: int  # --watch's exit status (killed when the run outlived RUN_TIMEOUT or the approval failed)
    approval: str | BaseException  # the id of the run whose form the UI answered, or what went wrong there
    shown: list[str]  # the command lines that showed a secret while it ran
    saw_the_workers: bool  # whether `ps` showed the workers meanwhile (it looked at the right processes)
    training: dict  # the training parameters given
    sha256: str  # the pretrained weights' (a state dict of our own: real ImageNet files cannot be fetched here)
    killed: list[int]  # the torchrun worker killed after the first epoch

    @property
    def run_dir(self) -> Path:
        (run_dir,) = [p.parent for p in self.runs.glob("*/run.json")]
        return run_dir


WEIGHTS = "/models/resnet18-own.pth"
# Generous: the finished run's time grows several-fold beside the other fan-out files (BENCHMARKS.md, "The suite's
# CPU-seconds").
RUN_TIMEOUT = 1800


@pytest.fixture(scope="module")
def weights_mirror():
    """A loopback HTTP server holding the pretrained weights (``WEIGHTS``), recording each request."""
    with FileServer() as running:
        yield running


def log_in(driver, stack) -> None:
    """The UI's login form, answered with the secret; nothing of the server shows before. (Prefect's UI sends a deep
    link opened before the login to "Page not found": a person logs in at a page of the menu first.)"""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{stack.url}/deployments")
    password = WebDriverWait(driver, 60).until(
        expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, "input[type=password]"))
    )
    assert "retrain-digits" not in driver.find_element(By.TAG_NAME, "body").text
    password.send_keys(stack.auth, Keys.ENTER)
    wait_for_text(driver, ["retrain-digits", "score-images"], timeout=60)


def answer_the_approval_form_in_the_ui(stack, watching: Future, registry: str, profile: Path) -> str:
    """Once the run of ``registry`` pauses: logged in, its approval form opened from the run's page in headless
    Chromium, answered (approve, reviewer, comment) and submitted; the run's id. ``watching`` ends with the run's
    --watch. The form is screenshotted into SHOTS."""
    from prefect.client.orchestration import SyncPrefectClient

    run_id = paused_run_id(stack, watching, timeout=RUN_TIMEOUT, flow="train-pipeline", registry=registry)
    driver = chromium(profile)
    try:
        log_in(driver, stack)
        driver.get(f"{stack.url}/runs/flow-run/{run_id}")
        wait_for_text(driver, ["Paused", "Resume"])
        click_text(driver, "Resume")
        form = wait_for_text(
            driver,
            [
                f"Promote {MODEL} version 1 to production?",
                "challenger: version 1",
                "Decision",
                "Reviewer",  # required: the record names who decided
                "Comment (Optional)",
            ],
        )
        assert "f1_macro (decides)" in form and "Reviewer (Optional)" not in form
        field(driver, "Decision", "div[contains(@class, 'p-select')]").click()
        click_text(driver, "approve")
        field(driver, "Reviewer", "textarea").send_keys("ada")
        field(driver, "Comment", "textarea").send_keys("looks right")
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / "approval-form.png"))
        click_text(driver, "Submit")
        # The answer reached the server once the run leaves Paused (the page, as a person sees it, if it never does).

        def the_page() -> str:
            driver.save_screenshot(str(SHOTS / "approval-submitted.png"))
            page = driver.find_element("tag name", "body").text
            return f"the run to leave Paused after Submit; the page shows:\n{page[:2000]}"

        with SyncPrefectClient(stack.api_url, auth_string=stack.auth) as client:
            wait_for(lambda: not client.read_flow_run(run_id).state.is_paused(), 60, interval=1, what=the_page)
    finally:
        driver.quit()
    return run_id


def kill_a_worker_after_the_first_epoch(runs: Path) -> list[int]:
    """SIGKILL to one torchrun worker training into ``runs`` once its first epoch is recorded: the pids killed."""
    for metrics_file in runs.glob("*/model/metrics.json"):
        if '"epoch": 1' in metrics_file.read_text() and (pids := worker_pids(metrics_file.parent)):
            os.kill(pids[0], signal.SIGKILL)
            return [pids[0]]
    return []


@pytest.fixture(scope="module")
def finished_run(stack, digits_subset, weights_mirror, tmp_path_factory) -> Iterator[FinishedRun]:
    """Your own photos to an approved model through the team's server. One folder (the digits' 40 images of each
    class) is split for validation; a ResNet-18 starts from pretrained weights fetched from a mirror (HTTP on
    loopback) and hash-checked, trains on 2 processes with a random rotation, exports to ONNX and registers on S3
    with the planted key. The run is triggered from the shell with --watch through `deployments.auth client`
    (which finds the secret in its file, as docs/operations.md shows) and picked up by a worker. torchrun without
    restarts fails when a worker is killed after the first epoch; the train task's retry resumes from the
    checkpoint. The promotion waits for a person's approval, given in the UI's form (headless Chromium). `ps` is
    looked at every second while it runs. Run once for the module and recorded, not asserted: the tests below
    each check one part of the record."""
    import torch
    import torchvision
    from prefect.client.orchestration import SyncPrefectClient

    from tasks.storage.s3 import s3_client

    tmp_path = tmp_path_factory.mktemp("deployment-run")
    bucket = f"deployment-run-{uuid.uuid4().hex[:12]}"
    s3 = s3_client()
    s3.create_bucket(Bucket=bucket)
    photos = tmp_path / MODEL.split("-")[0]  # one folder: the digits' 40 images of each class
    for part in digits_subset:
        shutil.copytree(part, photos, dirs_exist_ok=True)
    buffer = io.BytesIO()
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), buffer)
    weights_mirror.files[WEIGHTS] = buffer.getvalue()
    sha256 = hashlib.sha256(buffer.getvalue()).hexdigest()
    training = {"epochs": 4, "processes_per_node": 2, "learning_rate": 0.002, "max_restarts": 0}
    registry = f"s3://{bucket}/registry"
    parameters = {
        "train_data": str(photos),
        "validation_fraction": 0.25,
        "model": {  # pretrained left empty: your own images start from the pretrained weights
            "architecture": "resnet18",
            "weights_path": f"{weights_mirror.url}{WEIGHTS}",
            "weights_sha256": sha256,
            "transformations": {"random_rotation": True},  # on with its defaults, as on the command line
        },
        "training": training,
        "registry": registry,
        "work_dir": str(tmp_path / "runs"),
        "promotion": {
            "promote_to": "production",
            "promotion_metric": "f1_macro",
            "approval": True,
            "approval_timeout_s": RUN_TIMEOUT,
        },
        "export_onnx": True,
    }
    command = [
        sys.executable, "-m", "deployments.auth", "client", "--",
        sys.executable, "-m", "prefect", "--no-prompt", "deployment", "run", "train-pipeline/retrain-digits",
        "--params", json.dumps(parameters), "--watch",
    ]  # fmt: skip
    watching = subprocess.Popen(
        command,
        cwd=PROJECT_ROOT,
        env={**stack.env, "COLUMNS": "1000"},  # a wide terminal: rich folds lines at its width
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    shown, saw_the_workers, killed = [], [], []
    with ThreadPoolExecutor(2) as pool:
        ended = pool.submit(watching.wait)
        approving = pool.submit(answer_the_approval_form_in_the_ui, stack, ended, registry, tmp_path / "chromium")

        def look() -> bool:
            """The server, the workers, the flow run and torchrun's processes, looked at while they run: True once
            --watch ended or the approval failed."""
            ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True).stdout
            shown.extend(line for line in ps.splitlines() if any(secret in line for secret in stack.secrets.values()))
            saw_the_workers.append(f"--name {WORKERS[0]}" in ps)
            killed.extend([] if killed else kill_a_worker_after_the_first_epoch(tmp_path / "runs"))
            return watching.poll() is not None or (approving.done() and approving.exception() is not None)

        try:
            wait_for(look, RUN_TIMEOUT, interval=1, what="the run's --watch to end")
        except AssertionError:  # recorded: --watch is killed, its exit status says so
            pass
        if watching.poll() is None:
            watching.kill()
        watched, _ = watching.communicate(timeout=60)
    approval = approving.exception() or approving.result()
    flow_run_id = next((line.split()[-1] for line in watched.splitlines() if "UUID:" in line), None)
    if flow_run_id is None:
        pytest.fail(f"`prefect deployment run --watch` created no run:\n{watched[-3000:]}{stack.log_text()[-3000:]}")
    with SyncPrefectClient(stack.api_url, auth_string=stack.auth) as client:
        run = client.read_flow_run(flow_run_id)
    yield FinishedRun(
        run,
        registry,
        tmp_path / "runs",
        watched,
        watching.returncode,
        approval,
        shown,
        any(saw_the_workers),
        training,
        sha256,
        killed,
    )
    delete_bucket(s3, bucket)


@pytest.fixture(scope="module")
def registration(finished_run):
    """The finished run's version as the registry records it."""
    return read_registration(finished_run.registry, MODEL, 1)


@pytest.fixture(scope="module")
def registered_model(finished_run, tmp_path_factory):
    """The finished run's version fetched from the registry on S3, as a scoring host would."""
    return fetch_model(finished_run.registry, f"{MODEL}/1", tmp_path_factory.mktemp("fetched"))


@pytest.fixture(scope="module")
def run_record(stack, finished_run) -> tuple[list, list]:
    """The finished run's artifacts and task runs, as the server holds them."""
    return run_artifacts_and_task_runs(stack, finished_run.run.id)


def test_the_watched_deployment_run_completes_on_one_worker_of_the_gpu_pool(stack, finished_run):
    run = finished_run.run
    assert finished_run.watch_exit == 0, finished_run.watched[-3000:] + stack.log_text()[-3000:]
    assert run.state.is_completed(), (run.state, stack.log_text()[-3000:])
    deployment, _ = asyncio.run(read_deployment_and_artifacts(stack, run))
    assert deployment.work_pool_name == "gpu" and not deployment.schedules[0].active
    assert len(worker_that_ran(stack, run)) == 1, "one worker ran it"


def test_the_run_publishes_every_stage_artifact(stack, finished_run):
    _, artifact_keys = asyncio.run(read_deployment_and_artifacts(stack, finished_run.run))
    assert STAGE_ARTIFACTS <= artifact_keys, STAGE_ARTIFACTS - artifact_keys


def test_the_run_registers_one_version_recording_its_run_and_training_parameters(finished_run, registration):
    assert list_versions(finished_run.registry, MODEL) == [1]
    assert registration.flow_run_id == str(finished_run.run.id)
    assert registration.params["training"] == TrainingParams(**finished_run.training).model_dump()


def test_the_state_and_the_end_of_watch_say_what_came_of_the_run_in_one_line(finished_run, registration):
    """What a person sees: the run's state says what came of it in one line, and so does the end of `--watch`."""
    run, registry, figures = finished_run.run, finished_run.registry, registration.metrics
    assert run.state.message == (
        f"Registered {MODEL} version 1 in {registry}/{MODEL}/1: top-1 {figures['best_top1']:.4g}, "
        f"F1 (macro) {figures['f1_macro']:.4g} on 100 validation images"
    )
    assert f"Finished in state Completed({run.state.message!r})" in finished_run.watched
    assert finished_run.watched.rstrip().endswith("Flow run finished successfully in 'Completed'.")


def test_the_model_learns_the_digits_far_above_chance(registration):
    """Sensible, not lucky: ten classes from 300 images in four epochs, far above chance (0.1)."""
    figures = registration.metrics
    assert figures["accuracy"] >= 0.7 and figures["best_top1"] == pytest.approx(figures["accuracy"])
    assert figures["f1_weighted"] > 0


def test_the_onnx_export_is_registered_beside_the_weights(finished_run, registration):
    from tasks.storage.s3 import list_s3_names

    assert "model.onnx" in registration.files
    assert f"{MODEL}/1/model.onnx" in list_s3_names(finished_run.registry)


def test_the_promotion_waits_for_the_approval_given_in_the_ui_form(finished_run, registration, run_record):
    """The record says the version awaited approval; the answer and the promotion are the version's status, and
    the model card's latest version (published again once the approval is answered) names them."""
    if isinstance(finished_run.approval, BaseException):
        raise finished_run.approval
    assert finished_run.approval == str(finished_run.run.id)
    registry = finished_run.registry
    assert registration.promotion.awaiting_approval and registration.promotion.metric == "f1_macro"
    approval = show_version(registry, f"{MODEL}/1").approval
    assert (approval.decision, approval.reviewer, approval.comment) == ("approved", "ada", "looks right")
    assert resolve(registry, f"{MODEL}@production").version == 1
    assert "approved by ada" in latest_card(run_record) and "“looks right”" in latest_card(run_record)


def latest_card(run_record) -> str:
    """The model card's latest version: it is published at registration and again once the approval is answered."""
    artifacts, _ = run_record
    return max((a for a in artifacts if a.key == f"model-card-{MODEL}"), key=lambda a: a.created).data


def test_one_folder_is_split_a_quarter_of_each_class_for_validation_recording_where_from(finished_run, registration):
    """A quarter of each class's 40 images validate, and each side's manifest says where it came from."""
    validation = ImageDirectory(finished_run.run_dir / "data" / "validation")
    assert registration.datasets["validation"].images == len(validation) == registration.metrics["images"] == 100
    assert registration.datasets["train"].images == 300
    assert validation.manifest.split.side == "second" and validation.manifest.split.fraction == pytest.approx(0.75)
    assert registration.datasets["validation"].split == validation.manifest.split


def test_the_pretrained_weights_are_fetched_once_checked_and_recorded(
    finished_run, weights_mirror, registration, registered_model
):
    """Fetched once (not again by the retry), checked, and recorded by name and hash; the model was trained from
    them, with the transformation given."""
    sha256, model = finished_run.sha256, registered_model
    assert weights_mirror.requests == [WEIGHTS]
    assert model.spec.pretrained and model.spec.weights.sha256 == sha256
    assert registration.params["pretrained_weights"]["sha256"] == sha256
    assert model.spec.transformations.random_rotation == RandomRotation()
    assert model.classes == [str(d) for d in range(10)]


def test_the_registered_model_scores_the_validation_images_as_the_run_did(finished_run, registration, registered_model):
    validation = ImageDirectory(finished_run.run_dir / "data" / "validation")
    rescored = score_images(registered_model, validation)
    assert (rescored["Scored Labels"] == rescored["label"]).mean() == pytest.approx(registration.metrics["accuracy"])


def test_the_model_card_names_the_weights_the_transformation_and_the_split(finished_run, run_record):
    card = latest_card(run_record)
    assert finished_run.sha256[:12] in card and "random rotation" in card
    assert "75% of" in card and "split with seed 1" in card


def test_every_page_the_run_publishes_says_its_figure_in_one_line(run_record):
    artifacts, _ = run_record
    undescribed = [a.key for a in artifacts if a.type == "markdown" and not (a.description or "").strip()]
    assert not undescribed and all("\n" not in a.description for a in artifacts if a.type == "markdown")


def run_artifacts_and_task_runs(stack, flow_run_id) -> tuple[list, list]:
    with temporary_settings_for(stack):
        return asyncio.run(artifacts_and_task_runs(flow_run_id))


def test_a_killed_torchrun_worker_fails_the_first_attempt_and_the_retry_resumes_from_its_checkpoint(
    finished_run, run_record
):
    """The train task's retry resumed from the first attempt's checkpoint and trained the rest."""
    assert finished_run.killed, "training finished before a worker could be killed"
    model_folder = finished_run.run_dir / "model"
    assert [e.epoch for e in read_metrics(model_folder).epochs] == [1, 2, 3, 4]
    assert "resuming from" in (model_folder / "logs" / "driver_log_0.txt").read_text()
    _, task_runs = run_record
    train_run = next(t for t in task_runs if t.name.startswith("train"))
    assert train_run.run_count == 2 and train_run.state.is_completed()
    assert {t.state.type.value for t in task_runs} == {"COMPLETED"}


def test_the_retry_carries_on_the_first_attempts_progress_bar(stack, run_record):
    """One progress bar for both attempts, at its end, instead of one left stuck part-way."""
    _, task_runs = run_record
    train_run = next(t for t in task_runs if t.name.startswith("train"))
    with temporary_settings_for(stack):
        progress = asyncio.run(progress_artifacts(train_run.id))
    assert [(p.data, p.description) for p in progress] == [(100.0, "4 of 4 epochs")]


def test_the_training_curves_are_drawn_while_training_goes_on(run_record):
    """Live curves: a version of training-curves each time a launcher's poll saw a new epoch, then the final one
    (the retry's launcher draws again from the epoch it resumed after)."""
    artifacts, _ = run_record
    curves = sorted((a for a in artifacts if a.key == "training-curves"), key=lambda a: a.created)
    epochs_seen = [int(m[1]) for a in curves[:-1] if (m := re.match(r"so far: (\d) of 4 epochs", a.description))]
    assert len(epochs_seen) == len(curves) - 1 >= 2, [a.description for a in curves]
    assert epochs_seen == sorted(epochs_seen) and epochs_seen[0] < 4, "drawn while training went on"
    assert all("data:image/png;base64," in a.data for a in curves)
    assert curves[-1].description.startswith("best top-1 ")


def test_the_run_folder_keeps_the_results_and_leaves_the_model_files_to_the_registry(finished_run):
    """keep="results" (the default): the run keeps its data, metrics, logs, scores and pictures; the model files and
    the checkpoints go, the registry holding the model (which scores as the run did: the test above)."""
    run_dir = finished_run.run_dir
    model_folder = run_dir / "model"
    assert not any((model_folder / name).exists() for name in ("checkpoints", "model.pt", "model.onnx"))
    assert json.loads((model_folder / "registered.json").read_text()) == {
        "name": MODEL,
        "version": 1,
        "location": f"{finished_run.registry}/{MODEL}/1",
    }
    assert (run_dir / "run.json").is_file() and (run_dir / "scores.csv").is_file()
    assert (model_folder / "metrics.json").is_file() and (model_folder / "training_curves.png").stat().st_size > 0
    assert (run_dir / "confusion_matrix.png").stat().st_size > 0
    assert folder_size(run_dir) < 20 * 2**20


async def everything_the_run_left(stack, run_id) -> str:
    """The run's parameters, logs and artifacts, as one text."""
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    async with PrefectClient(stack.api_url, auth_string=stack.auth) as client:
        run = await client.read_flow_run(run_id)
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    texts = [json.dumps(run.parameters), *(log.message for log in logs)]
    texts += [f"{a.key} {a.description} {json.dumps(a.data, default=str)}" for a in artifacts]
    assert len(logs) > 10 and {"training-metrics", "registered-model"} <= {a.key for a in artifacts}
    return "\n".join(texts)


def test_no_process_shows_a_secret_in_its_arguments_while_the_run_runs(finished_run):
    """The API's password, the planted S3 key and database password, and PostgreSQL's own password, looked for
    in every process's arguments each second the run ran (the workers among them)."""
    assert finished_run.saw_the_workers and not finished_run.shown, finished_run.shown


def the_registrys_records(stack, finished_run) -> str:
    from tasks.storage.s3 import list_s3_names, read_s3_object

    names = list_s3_names(finished_run.registry)
    assert f"{MODEL}/1/registration.json" in names, names
    records = [
        read_s3_object(f"{finished_run.registry}/{name}") for name in names if not name.endswith((".pt", ".onnx"))
    ]
    return "\n".join(r.decode(errors="replace") for r in records)


def the_run_folders_files(stack, finished_run) -> str:
    suffixes = {".json", ".csv", ".txt", ".md", ".log"}
    files = [p for p in finished_run.runs.rglob("*") if p.is_file() and p.suffix in suffixes]
    return "\n".join(p.read_text(errors="replace") for p in files)


PLACES = {
    "the run in Prefect": lambda stack, finished_run: asyncio.run(everything_the_run_left(stack, finished_run.run.id)),
    "the registry": the_registrys_records,
    "the run folder": the_run_folders_files,
    "the stack's logs": lambda stack, finished_run: stack.log_text(),
}


@pytest.mark.parametrize("place", PLACES)
def test_the_run_leaves_no_secret_in(stack, finished_run, place):
    """None of the secrets above in the run's Prefect logs, parameters and artifacts, its registration record, its
    run folder or the stack's own logs."""
    text = PLACES[place](stack, finished_run)
    assert not [what for what, secret in stack.secrets.items() if secret in text]


def test_each_worker_takes_one_run_at_a_time_and_no_database_error_is_logged(stack):
    """Two runs due at once, two `make worker`s (limit 1): each worker runs one, side by side, and neither the
    server (on PostgreSQL) nor a worker nor the flow runs they start logs a database error while the two overlap.
    The runs are bench/load.py's probe (task runs, logs, an artifact, then 20 s held) deployed on the `gpu` pool: a
    training would prove nothing more here at minutes of CPU. SQLite's figures under load are bench/load.py's
    (docs/operations.md)."""
    from bench.load import DATABASE_ERRORS, DEPLOYMENT, deploy_probe

    def errors(logs: str) -> int:
        texts = [p.read_text(errors="replace") for p in stack.logs.glob(logs)]
        return sum(text.count(pattern) for text in texts for pattern in DATABASE_ERRORS)

    before = {logs: errors(logs) for logs in ("gpu-*.log", "server.log")}
    with temporary_settings_for(stack):  # the probe's calls take the URL from it, and the auth string with it
        deploy_probe(stack, pool="gpu")
    ids = queue_runs_at_once(stack, [{"index": i, "hold_seconds": 20} for i in range(2)], name=DEPLOYMENT)
    runs = wait_for_runs(stack, ids)
    workers_errors, server_errors = (errors(logs) - count for logs, count in before.items())
    assert all(r.state.is_completed() for r in runs), stack.log_text()[-3000:]
    assert sorted(w for r in runs for w in worker_that_ran(stack, r)) == list(WORKERS)
    starts = sorted((r.start_time, r.end_time) for r in runs)
    assert starts[1][0] < starts[0][1], "the two runs did not overlap"
    assert (workers_errors, server_errors) == (0, 0), stack.log_text()[-3000:]


def test_make_worker_names_the_worker_after_its_host_and_takes_one_run_by_default():
    dry_run = subprocess.run(
        ["make", "-n", "-o", f"{sys.prefix}/.installed", "worker", f"VENV={sys.prefix}"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"-m deployments.worker --pool gpu --name gpu-{socket.gethostname()} --limit 1" in dry_run


def test_make_deploy_prints_what_was_deployed_and_what_to_do_next(stack):
    printed = (stack.logs / "deploy.log").read_text()
    assert "Deployed 8 deployments" in printed and "make worker POOL=" in printed
    assert "deployment run 'train-pipeline/retrain-digits'" in printed
    # Prefect's own hints would have a user start train-node runs, which only the train stage starts.
    assert "deployment run 'train-node" not in printed and "prefect worker start" not in printed
    assert "deployment run 'sweep-trial" not in printed and "sweep-trial/sweep-trial runs by a sweep" in printed
    assert "deployment run 'score-shard" not in printed
    assert "score-shard/score-shard and score-shard/score-shard-default runs by a sharded scoring" in printed


def test_serve_offers_the_deployments_of_the_file_under_their_own_names(stack):
    from deployments.serve import runner_deployments

    config = yaml.safe_load(DEPLOYMENT_FILE.read_text())
    with temporary_settings_for(stack):
        served = runner_deployments()
    assert [d.name for d in served] == [f"{entry['name']}-served" for entry in config["deployments"]]
    for deployment, entry in zip(served, config["deployments"]):
        assert deployment.parameters == entry.get("parameters", {})
        assert [s.active for s in deployment.schedules] == [s.get("active", True) for s in entry.get("schedules", [])]


def test_make_serve_runs_beside_make_deploy_on_one_server(stack, finished_run, tmp_path):
    """`make serve` after `make deploy`: the deployed runs still complete (above), and a served run does too."""
    parameters = {
        "images": str(finished_run.run_dir / "data" / "validation"),
        "model": f"{MODEL}@production",
        "registry": finished_run.registry,
        "work_dir": str(tmp_path / "runs"),
    }
    wait_for_deployment(stack, "score-pipeline/score-images-served")
    flow_run_id = run_deployment(stack, parameters, name="score-pipeline/score-images-served")
    (run,) = wait_for_runs(stack, [flow_run_id], timeout=200)
    assert run.state.is_completed(), stack.log_text()[-3000:]
    assert str(run.id) in (stack.logs / "serve.log").read_text() and not worker_that_ran(stack, run)
    assert run.state.message.startswith("Scored 100 images with ") and "accuracy" in run.state.message


def test_parameter_descriptions_read_as_plain_text_in_the_ui_form(stack):
    """The UI renders descriptions as markdown with HTML: an `<x>` in one disappears from the form."""
    from prefect.client.orchestration import get_client

    with temporary_settings_for(stack), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("train-pipeline/retrain-digits")
    descriptions = {k: v.get("description", "") for k, v in deployment.parameter_openapi_schema["properties"].items()}
    assert not [k for k, text in descriptions.items() if "<" in text or ">" in text]
    assert "digits-resnet18" in descriptions["model_name"]
    # Your own photos from the form: one folder split for validation, pretrained weights, transformations, the
    # fine-tuning mode and any torchvision architecture.
    assert "validation_fraction" in descriptions
    schema = deployment.parameter_openapi_schema
    # Near-duplicates kept on one side: a typed number on the form, with its default.
    distance = schema["properties"]["near_duplicate_distance"]
    assert distance["type"] == "integer" and distance["default"] == 8 and "perceptual hashes" in distance["description"]
    definitions = schema.get("definitions") or schema.get("$defs")
    model = definitions["ModelSpec"]["properties"]
    assert {"pretrained", "weights_path", "weights_sha256", "transformations"} <= set(model)
    assert "convnext_tiny" in model["architecture"]["enum"]
    assert {"fine_tuning", "backbone_lr_factor"} <= set(definitions["TrainingParams"]["properties"])


def test_a_deployment_run_takes_true_for_a_transformation_as_the_command_line_does(stack):
    """`prefect deployment run --params` with `true` for an image transformation (the option with its defaults): the
    server, which checks a run's parameters against the deployment's schema (the UI's form is built from it too),
    takes it, and still refuses a wrong type. The run is due in an hour, so no worker takes it before it is deleted."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    switched = {"model": {"transformations": {"random_rotation": True}}}
    flow_run_id = run_deployment(stack, switched, "train-pipeline/retrain-digits", "--start-in", "1 hour")
    with temporary_settings_for(stack), get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(flow_run_id)
            wrong = {"model": {"transformations": {"random_rotation": "yes"}}}
            with pytest.raises(PrefectHTTPStatusError) as refused:
                client.create_flow_run_from_deployment(run.deployment_id, parameters=wrong)
        finally:
            client.delete_flow_run(flow_run_id)
    assert run.parameters["model"] == switched["model"] and run.state.is_scheduled()
    assert refused.value.response.status_code == 409
    assert "'yes' is not valid under any of the given schemas" in refused.value.response.text


def test_the_ui_asks_for_the_secret_then_shows_the_deployment_and_the_finished_run_with_its_artifacts(
    stack, finished_run, tmp_path
):
    """Headless Chromium against the same server: it shows nothing before the secret is typed in; then the run, its
    artifacts, the model card (its table fits a 1440 px window) and the deployment. Screenshots land in
    build/ui-check/ for a person to look at (the README's docs/images/ pictures are made the same way by
    docs/screenshots.py)."""
    run = finished_run.run
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver = chromium(tmp_path / "chromium")
    try:
        log_in(driver, stack)
        driver.get(f"{stack.url}/runs/flow-run/{run.id}")
        wait_for_text(driver, [run.name, "Completed", "train-pipeline", "retrain-digits", "gpu"])
        driver.save_screenshot(str(SHOTS / "flow-run.png"))
        click_text(driver, "Artifacts")
        wait_for_text(driver, sorted(STAGE_ARTIFACTS - {"training-progress"}))
        driver.save_screenshot(str(SHOTS / "flow-run-artifacts.png"))

        card_id = latest_artifact_id(stack, f"model-card-{MODEL}", str(run.id))
        driver.get(f"{stack.url}/artifacts/artifact/{card_id}")
        driver.set_window_size(1440, 900)
        wait_for_text(driver, [f"Model card: {MODEL}", "approved by ada", "“looks right”", "production"])
        driver.save_screenshot(str(SHOTS / "model-card.png"))
        # The box around the card's table (which scrolls what does not fit) needs no scroll.
        assert table_overflow(driver) <= 0, f"the model card's table is {table_overflow(driver)} px too wide at 1440 px"

        driver.get(f"{stack.url}/deployments/deployment/{run.deployment_id}")
        wait_for_text(driver, ["retrain-digits", "train-pipeline", "gpu", "At 03:00 AM, only on Monday", run.name])
        driver.save_screenshot(str(SHOTS / "deployment.png"))
        click_text(driver, "Parameters")
        wait_for_text(driver, ["train_data", "training", "model"])
        driver.save_screenshot(str(SHOTS / "deployment-parameters.png"))
    finally:
        driver.quit()
    shots = ("approval-form.png", "flow-run.png", "model-card.png", "deployment.png")
    assert all((SHOTS / name).stat().st_size > 10_000 for name in shots)


def test_a_schedule_switched_on_makes_runs_and_stays_on_through_a_redeploy(stack):
    """As in the UI: switch the weekly schedule on; the server's scheduler creates its runs; `make deploy`
    again leaves it on (the file ships it paused)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    with temporary_settings_for(stack), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("train-pipeline/retrain-digits")
        client.update_deployment_schedule(deployment.id, deployment.schedules[0].id, active=True)
        only_this = DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
        waiting = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])))
        scheduled = wait_for(
            lambda: client.read_flow_runs(deployment_filter=only_this, flow_run_filter=waiting),
            60,
            interval=1,
            what=lambda: "a scheduled run:\n" + stack.log_text()[-3000:],
        )
        starts = [r.expected_start_time.astimezone(timezone.utc) for r in scheduled]
        assert {(t.weekday(), t.hour, t.minute) for t in starts} == {(0, 3, 0)}, "Mondays at 03:00 UTC"

        make(stack, "deploy")
        assert client.read_deployment_by_name("train-pipeline/retrain-digits").schedules[0].active


def post(url: str, body: dict, auth: str | None = None) -> int:
    """The HTTP status of a JSON POST, with basic auth when ``auth`` is given."""
    import base64
    import urllib.error

    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_server_on_every_address_asks_for_the_secret_and_refuses_the_shell_step_attack(stack, tmp_path):
    """`make server HOST=0.0.0.0` created the secret in a 0600 file and turned basic auth on: no one without it may
    create a deployment whose pull step runs a shell command on every worker host. A host without the file, or a
    command not run through `deployments.auth client`, is told so in one line."""
    import stat

    path = stack.auth_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert f"Prefect API basic auth: created {path}" in (stack.logs / "server.log").read_text()
    assert post(f"{stack.api_url}/flows/", {"name": "anonymous"}) == 401
    attack = {
        "name": "attack",
        "flow_id": str(uuid.uuid4()),
        "work_pool_name": "gpu",
        "pull_steps": [{"prefect.deployments.steps.run_shell_script": {"script": "touch /tmp/owned"}}],
    }
    assert post(f"{stack.api_url}/deployments/", attack) == 401
    assert post(f"{stack.api_url}/flows/", {"name": "with-the-secret"}, auth=stack.auth) == 201

    elsewhere = {**stack.env, "IMAGE_CLASSIFIER_CONFIG": str(tmp_path)}  # a host the file was not copied to
    command = [sys.executable, "-m", "deployments.auth", "client", "--", "true"]
    told = subprocess.run(command, cwd=PROJECT_ROOT, env=elsewhere, capture_output=True, text=True)
    assert told.returncode != 0 and told.stderr.count("\n") == 1 and "asks for basic auth" in told.stderr

    assert CLIENT_AUTH not in stack.env
    command = [sys.executable, "-m", "deployments.deploy"]
    told = subprocess.run(command, cwd=PROJECT_ROOT, env=stack.env, capture_output=True, text=True, timeout=120)
    assert told.returncode == 2 and told.stderr.count("\n") == 1, told.stderr
    assert f"the Prefect server at {stack.api_url} asks for credentials (HTTP 401)" in told.stderr


def test_make_postgres_keeps_its_password_private_and_listens_on_loopback(stack):
    """`make postgres`'s cluster: the password and the server's URL in 0600 files, listening on loopback only;
    `make server DB=postgresql` runs on it (the server reports PostgreSQL, with pg_trgm and Prefect's tables)."""
    from deployments.postgres import Cluster, connection

    cluster = Cluster(stack.postgres["POSTGRES_DIR"])
    for secret in (cluster.password_file, cluster.url_file):
        assert secret.stat().st_mode & 0o777 == 0o600, secret

    async def read() -> tuple:
        async with connection(cluster.url()) as conn:
            return (
                await conn.fetchval("SHOW listen_addresses"),
                await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'"),
                await conn.fetchval("SELECT count(*) FROM flow_run"),
            )

    listening, trigram, runs = asyncio.run(read())
    assert (listening, trigram) == ("127.0.0.1", 1) and runs >= 1
    assert "database: PostgreSQL 15" in (stack.logs / "server.log").read_text()


@pytest.mark.parametrize("fault", ["wrong password", "nothing listening"])
def test_make_server_on_a_database_it_cannot_use_says_so_in_one_line_before_starting(stack, tmp_path, fault):
    from deployments.postgres import Cluster, with_database

    url = Cluster(stack.postgres["POSTGRES_DIR"]).url()
    if fault == "wrong password":
        url = url.replace(url.split(":")[2].split("@")[0], "not-the-password")
        expected = "refused user 'prefect': wrong password (check the database URL)"
    else:
        url = with_database(url, "prefect").replace(f":{stack.postgres['POSTGRES_PORT']}/", f":{free_port()}/")
        expected = "(is it running? make postgres starts one)"
    (tmp_path / "database-url").write_text(url + "\n")
    (tmp_path / "database-url").chmod(0o600)
    env = {**stack.env, "IMAGE_CLASSIFIER_CONFIG": str(tmp_path)}
    env.pop("PREFECT_API_URL")
    server = stack.make(f"server-{fault}", "server", env=env, DB="postgresql", PORT=str(free_port()))
    assert server.wait(timeout=60) != 0
    output = (stack.logs / f"server-{fault}.log").read_text()
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and expected in errors[0] and "Traceback" not in output, output


def test_make_server_on_another_port_gives_the_ui_its_api_address(stack):
    """The UI asks /ui-settings where its API is: on every address (HOST=0.0.0.0), the host's name with the port
    given, never 127.0.0.1:4200 (a browser elsewhere would look for the API on its own machine)."""
    host = subprocess.run(["hostname", "-f"], capture_output=True, text=True, check=True).stdout.strip()
    with urllib.request.urlopen(f"{stack.url}/ui-settings", timeout=10) as answer:
        assert json.load(answer)["api_url"] == f"http://{host}:{stack.port}/api" != "http://127.0.0.1:4200/api"


def test_make_stops_when_torch_and_torchvision_do_not_work_together(tmp_path):
    """`make torch-check` (run after every install): a torchvision built for another torch is named as such."""
    broken = tmp_path / "torchvision"
    broken.mkdir()
    (broken / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    command = ["make", "--no-print-directory", "-o", f"{sys.prefix}/.installed", "torch-check", f"VENV={sys.prefix}"]
    fine = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)
    assert fine.returncode == 0, fine.stderr
    shadowed = {**os.environ, "PYTHONPATH": f"{tmp_path}:{PROJECT_ROOT}"}
    mismatched = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, env=shadowed, check=False)
    assert mismatched.returncode != 0
    assert "torch and torchvision in" in mismatched.stderr and "do not work together" in mismatched.stderr
    assert "operator torchvision::nms does not exist" in mismatched.stderr
    assert "Install a matching pair" in mismatched.stderr


# A lost host, on the same stack: the deployments and automations `make deploy` made, both workers on the `gpu` pool
# (hosts A and B: caches of their own, S3 as the work dir), a training run of `train-pipeline/retrain-digits` on the
# worker that takes it; that worker's whole process tree is killed mid-training, as a powered-off host would be: the
# run is set Crashed, run again on the other host, resumes from the checkpoint and registers one version.

DEPLOYMENT = "train-pipeline/retrain-digits"
LOST_HOST_MODEL = "colours-lost-host"
# The test's runs beat at the least Prefect allows, and are crashed after 2 missed beats, not make deploy's 3 × 60 s.
TEST_HEARTBEAT = 30
TEST_WITHIN = timedelta(seconds=2 * TEST_HEARTBEAT)


@contextmanager
def client_for(stack):
    """A Prefect client of the stack's server (PREFECT_API_URL set for the calls made meanwhile)."""
    from prefect.client.orchestration import get_client

    with temporary_settings_for(stack), get_client(sync_client=True) as client:
        yield client


class WebhookReceiver(http.server.ThreadingHTTPServer):
    """Records the body of every POST it is sent, on loopback."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.server.bodies.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def made_by_deploy(stack) -> list:
    """The deployments `make deploy` made from the file (`make serve`'s and the load probe's, on this server too,
    are not among them)."""
    names = {entry["name"] for entry in yaml.safe_load(DEPLOYMENT_FILE.read_text())["deployments"]}
    with client_for(stack) as client:
        return [d for d in client.read_deployments() if d.name in names]


@pytest.fixture(scope="module")
def automation(stack):
    """`make deploy`'s automation as deployed, then as the test wants it: the shorter wait, and a webhook (to a
    local receiver) added as docs/operations.md shows, then kept by a re-deploy. Returns (as deployed, as now,
    the webhook's receiver)."""
    from prefect.automations import Automation
    from prefect.blocks.webhook import Webhook
    from prefect.events.actions import CallWebhook

    receiver = WebhookReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{receiver.server_port}/lost-hosts"
    with client_for(stack) as client:
        (deployed,) = client.read_automations_by_name(ZOMBIE_AUTOMATION)
        # As in docs/operations.md ("Being told").
        block_id = Webhook(method="POST", url=url).save("lost-hosts", overwrite=True)
        added = Automation.read(name=ZOMBIE_AUTOMATION)
        added.actions.append(
            CallWebhook(
                block_document_id=block_id, payload='{"text": "{{ flow_run.name }} lost its host: set Crashed"}'
            )
        )
        added.update()
        ensure_zombie_automation(heartbeat_tag(RUN_HEARTBEAT_S), TEST_WITHIN)  # a re-deploy, with the test's wait
        (now,) = client.read_automations_by_name(ZOMBIE_AUTOMATION)
    yield deployed, now, receiver
    receiver.shutdown()


@pytest.mark.slow
def test_every_deployment_beats_and_make_deploy_makes_one_automation_for_them(stack, automation):
    deployed, now, _ = automation
    config = yaml.safe_load(DEPLOYMENT_FILE.read_text())
    beat = heartbeat_seconds(config)
    assert beat > 30  # Prefect's docs: more than 30 s (the installed Prefect rejects less than 30)
    # The runs that beat at the deployments' pace, tagged: every deployment's (and a command line's own: flows/cli.py).
    deployments = made_by_deploy(stack)
    assert len(deployments) == len(config["deployments"])
    assert all(heartbeat_tag(beat) in d.tags for d in deployments), [d.tags for d in deployments]
    assert deployed.enabled and deployed.trigger.within == timedelta(seconds=MISSED_HEARTBEATS * beat)
    assert deployed.trigger.match_related["prefect.resource.id"] == [f"prefect.tag.{heartbeat_tag(beat)}"]
    # Each deployment's runs start through deployments/engine.py with the client settings that ride out a server
    # restart (tests/flows/test_score_shards.py restarts a server under such runs).
    for job in [d.job_variables for d in deployments]:
        assert job["command"].endswith(" -m deployments.engine") and job["working_dir"] == str(PROJECT_ROOT), job
        assert job["env"]["PREFECT_CLIENT_MAX_RETRIES"] == RIDE_OUT_SERVER_RESTART["PREFECT_CLIENT_MAX_RETRIES"]
    assert [a.type for a in deployed.actions] == ["change-flow-run-state"] and deployed.actions[
        0
    ].state.value == "CRASHED"

    # Deploying again updates it in place, keeping the webhook someone added: still one of that name.
    assert now.id == deployed.id and now.trigger.within == TEST_WITHIN
    assert [a.type for a in now.actions] == ["change-flow-run-state", "call-webhook"]

    # The second runs the training pipeline's crashed runs again, and no other deployment's.
    with client_for(stack) as client:
        (rerun,) = client.read_automations_by_name(RERUN_AUTOMATION)
        training = client.read_deployment_by_name(DEPLOYMENT)
    assert rerun.enabled and rerun.trigger.expect == {"prefect.flow-run.Crashed"}
    assert rerun.trigger.match_related["prefect.resource.id"] == [f"prefect.deployment.{training.id}"]
    assert [(a.type, a.source) for a in rerun.actions] == [("run-deployment", "inferred")]


def client_for_state(stack, flow_run_id):
    with client_for(stack) as client:
        return client.read_flow_run(flow_run_id).state


def s3_keys(bucket: str, prefix: str) -> list[str]:
    from tasks.storage.s3 import s3_client

    pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def stored_epochs(bucket: str) -> int:
    """Complete epochs the run folder on S3 holds (metrics.json follows its checkpoint up), 0 before the first."""
    from tasks.launch.lost_runs import epochs_stored

    folders = [key[: -len("/metrics.json")] for key in s3_keys(bucket, "runs/") if key.endswith("/model/metrics.json")]
    return max((epochs_stored(f"s3://{bucket}/{folder}") or 0 for folder in folders), default=0)


def lost_host_runs(stack) -> list:
    """The runs of the lost-host test's training (the stack's other tests ran runs of their own)."""
    with client_for(stack) as client:
        return [r for r in client.read_flow_runs() if r.parameters.get("model_name") == LOST_HOST_MODEL]


def logs_and_artifacts(stack, run_id) -> tuple[str, dict[str, str]]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with client_for(stack) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
        logs = flow_run_log(stack.api_url, run_id)
    return logs, {a.key: a.data for a in artifacts}


@pytest.mark.slow
def test_a_training_whose_host_is_lost_is_set_crashed_and_resumed_on_another_host(
    stack, automation, colour_image_dirs, s3_bucket, tmp_path
):
    """The issue's scenario: a run on host A, host B idle on the pool, A lost after an epoch; the run is set
    Crashed, run again on B, resumes from the checkpoint A left on S3 and registers one version. Last in the file:
    it changes the training deployment's heartbeat and the automation's wait, and host A's worker is gone after."""
    from tasks.registry import list_versions, read_registration

    train, val = colour_image_dirs
    epochs = 12
    parameters = {
        "train_data": str(train),
        "validation_data": str(val),
        "model_name": LOST_HOST_MODEL,
        "model": {"pretrained": False},
        "training": {"epochs": epochs, "patience": epochs, "batch_size": 4, "processes_per_node": 1},
        "registry": f"s3://{s3_bucket}/registry",
        "work_dir": f"s3://{s3_bucket}/runs",  # no filesystem shared between the hosts
    }
    from prefect.client.schemas.actions import DeploymentUpdate

    with client_for(stack) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
        # Every run of the deployment beats at the test's pace, the re-run too (the automation starts it with the
        # deployment's job variables): at the deployed 60 s against the test's 60 s wait, a re-run's next beat
        # raced the automation, which once set it Crashed and ran it a third time (a CI run on PostgreSQL).
        variables = dict(deployment.job_variables or {})
        variables["env"] = {**variables.get("env", {}), HEARTBEAT_SETTING: str(TEST_HEARTBEAT)}
        client.update_deployment(deployment.id, DeploymentUpdate(job_variables=variables))
        run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
    started = time.monotonic()
    wait_for(
        lambda: client_for_state(stack, run.id).is_running() and worker_that_ran(stack, run),
        300,
        interval=1,
        what=lambda: f"the run to start on a worker:\n{stack.log_text()[-3000:]}",
    )
    # The worker that took it is host A; the other one, idle on the pool, is host B (a second GPU host).
    (host_a,) = worker_that_ran(stack, run)
    (host_b,) = [name for name in WORKERS if name != host_a]
    # Lost after its first epoch, as in the issue: a checkpoint stored on S3, the run beating.

    def stored_and_beating() -> bool:
        assert stack.workers[host_a].poll() is None, stack.log_text()[-3000:]
        return stored_epochs(s3_bucket) >= 1 and heartbeats_of(stack.api_url, run.id, stack.auth)

    wait_for(  # the same 300 s as the start
        stored_and_beating,
        300 - (time.monotonic() - started),
        interval=1,
        what=lambda: f"a checkpoint on S3 and a heartbeat:\n{stack.log_text()[-3000:]}",
    )

    # The host is lost: its worker's process tree and the training it started (torchrun's workers run in sessions
    # of their own) stop at once, stopped first so that none sees another die.
    host_a_files = stack.caches[host_a]
    worker = stack.workers[host_a]
    tree = set(process_tree(worker.pid)) | set(training_processes(host_a_files))
    assert worker.pid in tree and training_processes(host_a_files), tree
    lose(tree)
    lost = time.monotonic()

    # Crashed once no heartbeat came for TEST_WITHIN after the last one: at most that long after the loss, plus
    # the server's evaluation pace (5 s) and margin.
    state = wait_for(
        lambda: None if (now := client_for_state(stack, run.id)).is_running() else now,
        TEST_WITHIN.total_seconds() + 30,
        interval=1,
        what=lambda: f"the lost run to leave Running:\n{stack.log_text()[-3000:]}",
    )
    seconds = time.monotonic() - lost
    print(f"lost host -> {state.name} in {seconds:.0f} s (heartbeat {TEST_HEARTBEAT} s, within {TEST_WITHIN})")
    assert state.is_crashed() and state.message.startswith("No heartbeat for 60 s"), state
    assert not training_processes(host_a_files), "a training process was left running"
    # Read now, not at the loss: an upload under way then may still have landed.
    resumable = stored_epochs(s3_bucket)
    assert 1 <= resumable < epochs, resumable

    # The webhook added to the automation was called with the run's name.
    receiver = automation[2]
    wait_for(lambda: receiver.bodies, 30, interval=1, what=lambda: f"the webhook:\n{stack.log_text()[-3000:]}")
    assert receiver.bodies == [f'{{"text": "{run.name} lost its host: set Crashed"}}']

    # The training is run again, on host B (A is gone), with the lost run's parameters, and finishes.

    def rerun_ended() -> list | None:
        assert stack.workers[host_b].poll() is None, stack.log_text()[-3000:]
        again = [r for r in lost_host_runs(stack) if r.id != run.id]
        return again if again and again[0].state.is_final() else None

    again = wait_for(rerun_ended, 420, interval=2, what=lambda: f"the re-run to end:\n{stack.log_text()[-3000:]}")
    print(f"lost host -> re-run {again[0].state.name} in {time.monotonic() - lost:.0f} s")
    (rerun,) = again
    assert rerun.state.is_completed(), (rerun.state, stack.log_text()[-3000:])
    assert rerun.deployment_id == run.deployment_id
    assert rerun.parameters == {**parameters, "replaces_run": str(run.id)}
    assert f"Flow run '{rerun.name}' submitted to infrastructure" in (stack.logs / f"{host_b}.log").read_text()

    # It says first which run it replaces and that it resumes after the epoch A's checkpoint holds, links to it...
    logs, artifacts = logs_and_artifacts(stack, rerun.id)
    headline = (
        f"Replaces run {run.name} (Crashed: No heartbeat for 60 s: the run's host, worker or process was lost "
        f"(automation {ZOMBIE_AUTOMATION!r})); re-run 1 of at most 2; resuming from its last checkpoint (epoch "
        f"{resumable} or later) in s3://{s3_bucket}/runs/{run.name}-{str(run.id)[:8]}"
    )
    # (its first line after Prefect's own: the worker's and "Beginning flow run")
    assert logs.split(f"Beginning flow run '{rerun.name}' for flow 'train-pipeline'\n")[1].startswith(headline), logs
    # The metrics are stored after the checkpoint they announce, so a host lost between the two left it ahead.
    resumed = re.search(r"\[rank 0\] INFO resuming from \S+ after epoch (\d+)\n", logs)
    assert resumed and resumable <= int(resumed[1]) < epochs, logs
    assert f"/runs/flow-run/{run.id})" in artifacts["replaced-run"] and headline in artifacts["replaced-run"]
    # ...and the lost run's page links to it.
    assert f"/runs/flow-run/{rerun.id})" in logs_and_artifacts(stack, run.id)[1]["replaced-by"]

    # One version for the training, registered by the run that finished it, from the whole training.
    registry = f"s3://{s3_bucket}/registry"
    assert list_versions(registry, "colours-lost-host") == [1]
    record = read_registration(registry, "colours-lost-host", 1)
    assert (record.flow_run_id, record.training_run_id) == (str(rerun.id), str(run.id))
    assert record.metrics["epochs_trained"] == epochs

    # Nothing left running: no training process on either host, no other run started or waiting.
    assert not training_processes(stack.caches[host_b]) and not training_processes(host_a_files)
    assert sorted(r.state.name for r in lost_host_runs(stack)) == ["Completed", "Crashed"]
