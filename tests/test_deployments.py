"""Deployments on the real path: a Prefect server, a `gpu` process work pool, `prefect deploy`, a real worker."""

import asyncio
import json

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

from deployments.local import PROJECT_ROOT, PrefectStack
from tasks.registry import list_versions, read_registration

DEPLOYMENT_FILE = PROJECT_ROOT / "deployments" / "prefect.yaml"
STAGE_ARTIFACTS = {"train-images", "validation-images", "label-validation", "model-spec", "training-progress",
                   "training-metrics", "scores", "evaluation", "registered-model"}  # fmt: skip


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
    """Server, `gpu` pool, deployments from deployments/prefect.yaml, one worker: stopped after the module."""
    with PrefectStack(home=tmp_path_factory.mktemp("prefect-home")) as running:
        running.cli("work-pool", "create", "gpu", "--type", "process")
        running.cli("deploy", "--prefect-file", str(DEPLOYMENT_FILE), "--all")
        running.start_worker("gpu")
        yield running


async def read_run(api_url, flow_run_id):
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with PrefectClient(api_url) as client:
        run = await client.read_flow_run(flow_run_id)
        deployment = await client.read_deployment(run.deployment_id)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return run, deployment, {a.key for a in artifacts}


def test_a_deployment_run_on_the_gpu_pool_trains_and_registers(stack, colour_image_dirs, tmp_path):
    train, val = colour_image_dirs
    parameters = {
        "train_data": str(train), "validation_data": str(val), "model_name": "colours-resnet18",
        "training": {"epochs": 1, "batch_size": 4, "processes_per_node": 2},
        "registry": str(tmp_path / "registry"), "work_dir": str(tmp_path / "runs"),
    }  # fmt: skip
    result = stack.cli(
        "deployment", "run", "train-pipeline/retrain-digits", "--params", json.dumps(parameters),
        "--watch", "--watch-interval", "1", "--watch-timeout", "400",
    )  # fmt: skip
    flow_run_id = next(line.split()[-1] for line in result.stdout.splitlines() if "UUID:" in line)

    run, deployment, artifact_keys = asyncio.run(read_run(stack.api_url, flow_run_id))
    assert run.state.is_completed(), stack.log_text()[-3000:]
    assert deployment.work_pool_name == "gpu" and not deployment.schedules[0].active
    assert STAGE_ARTIFACTS <= artifact_keys
    assert list_versions(tmp_path / "registry", "colours-resnet18") == [1]
    assert read_registration(tmp_path / "registry", "colours-resnet18", 1).flow_run_id == str(run.id)
    assert flow_run_id in (stack.logs / "gpu-worker-1.log").read_text(), "the worker ran it"


def test_serve_offers_the_same_deployments_as_the_deployment_file():
    from deployments.serve import runner_deployments

    config = yaml.safe_load(DEPLOYMENT_FILE.read_text())
    served = runner_deployments()
    assert [d.name for d in served] == [entry["name"] for entry in config["deployments"]]
    for deployment, entry in zip(served, config["deployments"]):
        assert deployment.parameters == entry.get("parameters", {})
        assert [s.active for s in deployment.schedules] == [s.get("active", True) for s in entry.get("schedules", [])]
