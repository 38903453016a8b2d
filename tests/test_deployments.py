"""Deployments on the real path: a Prefect server, a `gpu` process work pool, `prefect deploy`, a real worker."""

import asyncio
import json
import time

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

from deployments.local import PROJECT_ROOT, PrefectStack
from tasks.registry import list_versions, read_registration
from tests.browser import chromium, click_text, wait_for_text

DEPLOYMENT_FILE = PROJECT_ROOT / "deployments" / "prefect.yaml"
STAGE_ARTIFACTS = {"train-images", "validation-images", "label-validation", "model-spec", "training-progress",
                   "training-metrics", "training-curves", "scores", "evaluation", "registered-model"}  # fmt: skip


def test_every_deployment_names_a_real_flow_with_valid_parameters(monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    config = yaml.safe_load(DEPLOYMENT_FILE.read_text())
    assert config["deployments"]
    for deployment in config["deployments"]:
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        flow.validate_parameters(deployment.get("parameters", {}))
        for schedule in deployment.get("schedules", []):
            assert schedule["timezone"] and schedule["cron"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """Server, `gpu` and `default` pools, deployments from deployments/prefect.yaml, a `gpu` worker."""
    with PrefectStack(home=tmp_path_factory.mktemp("prefect-home")) as running:
        for pool in ("gpu", "default"):
            running.cli("work-pool", "create", pool, "--type", "process")
        running.cli("deploy", "--prefect-file", str(DEPLOYMENT_FILE), "--all")
        running.start_worker("gpu")
        yield running


async def read_deployment_and_artifacts(api_url, run):
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with PrefectClient(api_url) as client:
        deployment = await client.read_deployment(run.deployment_id)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
    return deployment, {a.key for a in artifacts}


def run_deployment(stack, parameters: dict) -> str:
    """Trigger a run of the training deployment through the API; returns its id (not waiting for it)."""
    result = stack.cli("deployment", "run", "train-pipeline/retrain-digits", "--params", json.dumps(parameters))
    return next(line.split()[-1] for line in result.stdout.splitlines() if "UUID:" in line)


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
        "train_data": str(train), "validation_data": str(val), "model_name": name,
        "training": {"epochs": 1, "batch_size": 4, "processes_per_node": 2},
        "registry": str(tmp_path / "registry"), "work_dir": str(tmp_path / "runs"),
    }  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(stack, colour_image_dirs, tmp_path_factory):
    """A training run triggered through the API, picked up by the worker, and finished."""
    tmp_path = tmp_path_factory.mktemp("deployment-run")
    flow_run_id = run_deployment(stack, tiny_training(colour_image_dirs, tmp_path, "colours-resnet18"))
    (run,) = wait_for(stack, [flow_run_id])
    return run, tmp_path / "registry"


def test_a_deployment_run_on_the_gpu_pool_trains_and_registers(stack, finished_run):
    run, registry = finished_run
    deployment, artifact_keys = asyncio.run(read_deployment_and_artifacts(stack.api_url, run))
    assert run.state.is_completed(), stack.log_text()[-3000:]
    assert deployment.work_pool_name == "gpu" and not deployment.schedules[0].active
    assert STAGE_ARTIFACTS <= artifact_keys
    assert list_versions(registry, "colours-resnet18") == [1]
    assert read_registration(registry, "colours-resnet18", 1).flow_run_id == str(run.id)
    assert str(run.id) in (stack.logs / "gpu-worker-1.log").read_text(), "the worker ran it"


def test_two_runs_at_once_on_one_worker_with_sqlite(stack, colour_image_dirs, tmp_path):
    """The scale note: count 'database is locked' in the server and worker logs while two runs overlap."""
    locked_before = stack.log_text().count("database is locked")
    ids = [run_deployment(stack, tiny_training(colour_image_dirs, tmp_path / str(i), "concurrent")) for i in range(2)]
    runs = wait_for(stack, ids)
    locked = stack.log_text().count("database is locked") - locked_before
    print(f"two concurrent runs on SQLite: states {[r.state.name for r in runs]}, 'database is locked' x{locked}")
    assert all(r.state.is_completed() for r in runs), stack.log_text()[-3000:]
    starts = sorted((r.start_time, r.end_time) for r in runs)
    assert starts[1][0] < starts[0][1], "the two runs did not overlap"


def test_serve_offers_the_same_deployments_as_the_deployment_file():
    from deployments.serve import runner_deployments

    config = yaml.safe_load(DEPLOYMENT_FILE.read_text())
    served = runner_deployments()
    assert [d.name for d in served] == [entry["name"] for entry in config["deployments"]]
    for deployment, entry in zip(served, config["deployments"]):
        assert deployment.parameters == entry.get("parameters", {})
        assert [s.active for s in deployment.schedules] == [s.get("active", True) for s in entry.get("schedules", [])]


def test_the_ui_shows_the_deployment_and_the_finished_run_with_its_artifacts(stack, finished_run):
    """Headless Chromium against the same server; screenshots land in build/ui-check/ for a person to look at."""
    run, _ = finished_run
    shots = PROJECT_ROOT / "build" / "ui-check"
    shots.mkdir(parents=True, exist_ok=True)
    driver = chromium()
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
