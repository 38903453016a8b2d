"""Deployments on the real path: a Prefect server, `make deploy`, two `make worker`s on the `gpu` pool, `make serve`."""

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

from deployments.local import PROJECT_ROOT, PrefectStack, free_port
from tasks.registry import list_versions, read_registration
from tests.browser import chromium, click_text, wait_for_text

pytestmark = pytest.mark.integration

DEPLOYMENT_FILE = PROJECT_ROOT / "deployments" / "prefect.yaml"
STAGE_ARTIFACTS = {
    "train-images",
    "validation-images",
    "label-validation",
    "model-spec",
    "training-progress",
    "training-metrics",
    "training-curves",
    "scores",
    "evaluation",
    "registered-model",
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
def stack(prefect_home, tmp_path_factory):
    """As a team sets it up: `make postgres` (a cluster of its own, on a free port), `make server DB=postgresql` on a
    free port (its scheduler looking every second), `make deploy`, two `make worker`s on `gpu`, and `make serve`."""
    import shutil
    import tempfile

    settings = {
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
        "IMAGE_CLASSIFIER_CONFIG": str(tmp_path_factory.mktemp("config")),  # no database-url of this machine's
    }
    # Not under pytest's folders: as root, the cluster runs as the postgres user, who cannot reach them.
    cluster = Path(tempfile.mkdtemp(prefix="image-classifier-test-make-pg-"))
    postgres = {"POSTGRES_DIR": str(cluster), "POSTGRES_PORT": str(free_port())}
    home = prefect_home("prefect-home")
    running = PrefectStack(
        home=home, settings=settings, make_server=True, server_variables={"DB": "postgresql", **postgres}
    )
    running.postgres = postgres
    try:
        make(running, "postgres", **postgres)
        with running:
            make(running, "deploy")
            for name in WORKERS:
                running.make(name, "worker", POOL="gpu", WORKER_NAME=name)
            running.make("serve", "serve")
            yield running
    finally:
        make(running, "postgres-stop", **postgres)
        shutil.rmtree(cluster, ignore_errors=True)


def worker_that_ran(stack, run) -> list[str]:
    """The workers that started ``run`` (another one may have tried, and been told it was taken)."""
    started = f"Flow run '{run.name}' submitted to infrastructure"
    return [name for name in WORKERS if started in (stack.logs / f"{name}.log").read_text()]


async def read_deployment_and_artifacts(api_url, run):
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with PrefectClient(api_url) as client:
        deployment = await client.read_deployment(run.deployment_id)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    return deployment, {a.key for a in artifacts}


def run_deployment(stack, parameters: dict, name="train-pipeline/retrain-digits", watch=False) -> tuple[str, str]:
    """Trigger a run of a deployment from the shell; returns its id and what the command printed
    (with ``watch``, everything up to the run's end)."""
    # A wide terminal: rich folds lines at its width.
    result = stack.cli(
        "deployment",
        "run",
        name,
        "--params",
        json.dumps(parameters),
        *(["--watch"] if watch else []),
        timeout=600,
        env={"COLUMNS": "1000"},
    )
    return next(line.split()[-1] for line in result.stdout.splitlines() if "UUID:" in line), result.stdout


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

    deadline = time.monotonic() + timeout
    with temporary_settings_for(stack), get_client(sync_client=True) as client:
        while True:
            try:
                return client.read_deployment_by_name(name)
            except ObjectNotFound:
                assert time.monotonic() < deadline, f"{name} never appeared:\n{stack.log_text()[-3000:]}"
                time.sleep(1)


def temporary_settings_for(stack):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings({PREFECT_API_URL: stack.api_url})


def wait_for(stack, flow_run_ids, timeout=400):
    async def poll():
        from prefect.client.orchestration import PrefectClient

        async with PrefectClient(stack.api_url) as client:
            deadline = time.monotonic() + timeout
            while True:
                runs = [await client.read_flow_run(i) for i in flow_run_ids]
                if all(r.state.is_final() for r in runs) or time.monotonic() > deadline:
                    return runs
                await asyncio.sleep(1)

    return asyncio.run(poll())


def tiny_training(colour_image_dirs, tmp_path, name):
    train, val = colour_image_dirs
    return {
        "train_data": str(train),
        "validation_data": str(val),
        "model_name": name,
        "model": {"pretrained": False},  # own images default to ImageNet weights: none to fetch in the tests
        "training": {"epochs": 1, "batch_size": 4, "processes_per_node": 1},
        "registry": str(tmp_path / "registry"),
        "work_dir": str(tmp_path / "runs"),
    }


@pytest.fixture(scope="module")
def finished_run(stack, colour_image_dirs, tmp_path_factory):
    """A training run triggered from the shell with --watch, picked up by a worker, and finished."""
    tmp_path = tmp_path_factory.mktemp("deployment-run")
    parameters = tiny_training(colour_image_dirs, tmp_path, "colours-resnet18")
    flow_run_id, watched = run_deployment(stack, parameters, watch=True)
    (run,) = wait_for(stack, [flow_run_id])
    return run, tmp_path / "registry", watched


def test_a_deployment_run_on_the_gpu_pool_trains_and_registers(stack, finished_run):
    run, registry, watched = finished_run
    deployment, artifact_keys = asyncio.run(read_deployment_and_artifacts(stack.api_url, run))
    assert run.state.is_completed(), stack.log_text()[-3000:]
    assert deployment.work_pool_name == "gpu" and not deployment.schedules[0].active
    assert STAGE_ARTIFACTS <= artifact_keys
    assert list_versions(registry, "colours-resnet18") == [1]
    assert read_registration(registry, "colours-resnet18", 1).flow_run_id == str(run.id)
    assert len(worker_that_ran(stack, run)) == 1, "one worker ran it"

    # What a person sees: the run's state says what came of it, and so does the end of `--watch`.
    location = (registry / "colours-resnet18" / "1").resolve()
    assert run.state.message.startswith(f"Registered colours-resnet18 version 1 in {location}: top-1 ")
    assert f"Finished in state Completed({run.state.message!r})" in watched
    assert watched.rstrip().endswith("Flow run finished successfully in 'Completed'.")


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
    deploy_probe(stack, pool="gpu")
    ids = queue_runs_at_once(stack, [{"index": i, "hold_seconds": 20} for i in range(2)], name=DEPLOYMENT)
    runs = wait_for(stack, ids)
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
    assert "Deployed 7 deployments" in printed and "make worker POOL=" in printed
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


def test_make_serve_runs_beside_make_deploy_on_one_server(stack, finished_run, colour_image_dirs, tmp_path):
    """`make serve` after `make deploy`: the deployed runs still complete (above), and a served run does too."""
    _, registry, _ = finished_run
    _, val = colour_image_dirs
    parameters = {
        "images": str(val),
        "model": "colours-resnet18",
        "registry": str(registry),
        "work_dir": str(tmp_path / "runs"),
    }
    wait_for_deployment(stack, "score-pipeline/score-images-served")
    flow_run_id, _ = run_deployment(stack, parameters, name="score-pipeline/score-images-served")
    (run,) = wait_for(stack, [flow_run_id], timeout=200)
    assert run.state.is_completed(), stack.log_text()[-3000:]
    assert str(run.id) in (stack.logs / "serve.log").read_text() and not worker_that_ran(stack, run)
    assert run.state.message.startswith("Scored 12 images with ") and "accuracy" in run.state.message


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


def test_the_ui_shows_the_deployment_and_the_finished_run_with_its_artifacts(stack, finished_run, tmp_path):
    """Headless Chromium against the same server; screenshots land in build/ui-check/ for a person to look at."""
    run, _, _ = finished_run
    shots = PROJECT_ROOT / "build" / "ui-check"
    shots.mkdir(parents=True, exist_ok=True)
    driver = chromium(tmp_path / "chromium")
    try:
        driver.get(f"{stack.url}/runs/flow-run/{run.id}")
        wait_for_text(driver, [run.name, "Completed", "train-pipeline", "retrain-digits", "gpu"])
        driver.save_screenshot(str(shots / "flow-run.png"))
        click_text(driver, "Artifacts")
        wait_for_text(driver, sorted(STAGE_ARTIFACTS - {"training-progress"}))
        driver.save_screenshot(str(shots / "flow-run-artifacts.png"))

        driver.get(f"{stack.url}/deployments/deployment/{run.deployment_id}")
        wait_for_text(driver, ["retrain-digits", "train-pipeline", "gpu", "At 03:00 AM, only on Monday", run.name])
        driver.save_screenshot(str(shots / "deployment.png"))
        click_text(driver, "Parameters")
        wait_for_text(driver, ["train_data", "training", "model"])
        driver.save_screenshot(str(shots / "deployment-parameters.png"))
    finally:
        driver.quit()
    assert all((shots / name).stat().st_size > 10_000 for name in ("flow-run.png", "deployment.png"))


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
        deadline = time.monotonic() + 60
        while not (scheduled := client.read_flow_runs(deployment_filter=only_this, flow_run_filter=waiting)):
            assert time.monotonic() < deadline, "nothing scheduled in a minute:\n" + stack.log_text()[-3000:]
            time.sleep(1)
        starts = [r.expected_start_time.astimezone(timezone.utc) for r in scheduled]
        assert {(t.weekday(), t.hour, t.minute) for t in starts} == {(0, 3, 0)}, "Mondays at 03:00 UTC"

        make(stack, "deploy")
        assert client.read_deployment_by_name("train-pipeline/retrain-digits").schedules[0].active


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


def test_make_run_against_the_postgresql_server_completes(stack, colour_image_dirs, tmp_path):
    """The issue's path on a fresh clone: `make postgres && make server DB=postgresql`, `make deploy`, `make worker`
    (the stack), then `make run` against it: the same target, command line and flow as on the digits, here on the
    small colour images (one epoch, one process) so that it costs seconds."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    train, validation = colour_image_dirs
    work = (
        f"--train-data {train} --validation-data {validation} --no-pretrained --batch-size 4 --epochs 1 "
        f"--processes-per-node 1 --model-name colours-pg --work-dir {tmp_path / 'runs'} "
        f"--registry {tmp_path / 'registry'}"
    )
    run = stack.make("make-run", "run", RUN_ARGS=work)
    assert run.wait(timeout=900) == 0, (stack.logs / "make-run.log").read_text()[-3000:]
    record = read_registration(tmp_path / "registry", "colours-pg", 1)
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        assert client.read_flow_run(record.flow_run_id).state.is_completed()


def test_make_server_on_another_port_gives_the_ui_its_api_address(stack):
    """The UI asks /ui-settings where its API is; on a port other than 4200 it must not be told 127.0.0.1:4200."""
    with urllib.request.urlopen(f"{stack.url}/ui-settings", timeout=10) as answer:
        assert json.load(answer)["api_url"] == stack.api_url != "http://127.0.0.1:4200/api"


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
