"""A lost host, on real components: a Prefect server with the deployments and automations `make deploy` makes, two
`prefect worker`s on the `gpu` pool (hosts A and B: caches of their own, S3 as the work dir), a training run of
`train-pipeline/retrain-digits` on A; A's worker's whole process tree is killed mid-training, as a powered-off host
would be: the run is set Crashed, run again on B, resumes from A's checkpoint and registers one version."""

import asyncio
import http.server
import re
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import pytest
import yaml

from deployments.automations import (
    HEARTBEAT_SETTING,
    MISSED_HEARTBEATS,
    RERUN_AUTOMATION,
    ZOMBIE_AUTOMATION,
    ensure_zombie_automation,
    heartbeat_seconds,
)
from deployments.local import PROJECT_ROOT, PrefectStack
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE
from tests.helpers import flow_run_log, lose, process_tree, s3_settings, training_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEPLOYMENT = "train-pipeline/retrain-digits"
# The test's runs beat at the least Prefect allows, and are crashed after 2 missed beats, not make deploy's 3 × 60 s.
TEST_HEARTBEAT = 30
TEST_WITHIN = timedelta(seconds=2 * TEST_HEARTBEAT)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_home, s3_endpoint, postgres_database):
    """A server, `make deploy`'s pools, deployments and automations, one worker (limit 1) with a cache of its own
    (another host's); every process reaches the loopback S3 endpoint."""
    settings = {
        "OMP_NUM_THREADS": "1",
        **s3_settings(s3_endpoint),
    }
    with PrefectStack(
        home=prefect_home("prefect-home"), database_url=postgres_database("zombie"), settings=settings
    ) as running:
        running.deploy()
        running.caches = {host: tmp_path_factory.mktemp(f"{host}-cache") for host in ("host-a", "host-b")}
        running.worker = running.start_worker(
            "gpu", "host-a", limit=1, env={CACHE_VARIABLE: str(running.caches["host-a"])}
        )
        yield running


@contextmanager
def client_for(stack):
    """A Prefect client of the stack's server (PREFECT_API_URL set for the calls made meanwhile)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
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
        ids = [str(d.id) for d in client.read_deployments()]
        # As in docs/operations.md ("Being told").
        block_id = Webhook(method="POST", url=url).save("lost-hosts", overwrite=True)
        added = Automation.read(name=ZOMBIE_AUTOMATION)
        added.actions.append(
            CallWebhook(
                block_document_id=block_id, payload='{"text": "{{ flow_run.name }} lost its host: set Crashed"}'
            )
        )
        added.update()
        ensure_zombie_automation(ids, TEST_WITHIN)  # a re-deploy, with the test's wait
        (now,) = client.read_automations_by_name(ZOMBIE_AUTOMATION)
    yield deployed, now, receiver
    receiver.shutdown()


def test_every_deployment_beats_and_make_deploy_makes_one_automation_for_them(stack, automation):
    deployed, now, _ = automation
    config = yaml.safe_load((PROJECT_ROOT / "deployments" / "prefect.yaml").read_text())
    beat = heartbeat_seconds(config)
    assert beat > 30  # Prefect's docs: more than 30 s (the installed Prefect rejects less than 30)
    with client_for(stack) as client:
        ids = {f"prefect.deployment.{d.id}" for d in client.read_deployments()}
    assert deployed.enabled and deployed.trigger.within == timedelta(seconds=MISSED_HEARTBEATS * beat)
    assert set(deployed.trigger.match_related["prefect.resource.id"]) == ids
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


def heartbeats_of(stack, flow_run_id) -> int:
    async def read():
        from prefect.client.orchestration import PrefectClient

        async with PrefectClient(stack.api_url) as client:
            response = await client._client.post(
                "/events/filter",
                json={
                    "filter": {
                        "event": {"name": ["prefect.flow-run.heartbeat"]},
                        "resource": {"id": [f"prefect.flow-run.{flow_run_id}"]},
                    }
                },
            )
            return response.json()["total"]

    return asyncio.run(read())


def s3_keys(bucket: str, prefix: str) -> list[str]:
    from tasks.storage.s3 import s3_client

    pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def stored_epochs(bucket: str) -> int:
    """Complete epochs the run folder on S3 holds (metrics.json follows its checkpoint up), 0 before the first."""
    from tasks.launch.lost_runs import epochs_stored

    folders = [key[: -len("/metrics.json")] for key in s3_keys(bucket, "runs/") if key.endswith("/model/metrics.json")]
    return max((epochs_stored(f"s3://{bucket}/{folder}") or 0 for folder in folders), default=0)


def flow_runs_of(stack) -> list:
    with client_for(stack) as client:
        return client.read_flow_runs()


def logs_and_artifacts(stack, run_id) -> tuple[str, dict[str, str]]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with client_for(stack) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    return flow_run_log(stack.api_url, run_id), {a.key: a.data for a in artifacts}


def test_a_training_whose_host_is_lost_is_set_crashed_and_resumed_on_another_host(
    stack, automation, colour_image_dirs, s3_bucket, tmp_path
):
    """The issue's scenario: a run on host A, host B idle on the pool, A lost after an epoch; the run is set
    Crashed, run again on B, resumes from the checkpoint A left on S3 and registers one version."""
    from tasks.registry import list_versions, read_registration

    train, val = colour_image_dirs
    epochs = 12
    parameters = {
        "train_data": str(train),
        "validation_data": str(val),
        "model_name": "colours-lost-host",
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
    deadline = time.monotonic() + 300
    while not client_for_state(stack, run.id).is_running():
        assert time.monotonic() < deadline and stack.worker.poll() is None, stack.log_text()[-3000:]
        time.sleep(1)
    # Host B joins the pool once A has the run: idle, as a second GPU host would be.
    host_b = stack.start_worker("gpu", "host-b", limit=1, env={CACHE_VARIABLE: str(stack.caches["host-b"])})
    # Lost after its first epoch, as in the issue: a checkpoint stored on S3, the run beating.
    while not (stored_epochs(s3_bucket) >= 1 and heartbeats_of(stack, run.id)):
        assert time.monotonic() < deadline, stack.log_text()[-3000:]
        assert stack.worker.poll() is None, stack.log_text()[-3000:]
        time.sleep(1)

    # The host is lost: its worker's process tree and the training it started (torchrun's workers run in sessions
    # of their own) stop at once, stopped first so that none sees another die.
    host_a_files = stack.caches["host-a"]
    tree = set(process_tree(stack.worker.pid)) | set(training_processes(host_a_files))
    assert stack.worker.pid in tree and training_processes(host_a_files), tree
    lose(tree)
    lost = time.monotonic()

    # Crashed once no heartbeat came for TEST_WITHIN after the last one: at most that long after the loss, plus
    # the server's evaluation pace (5 s) and margin.
    while (state := client_for_state(stack, run.id)).is_running():
        assert time.monotonic() - lost < TEST_WITHIN.total_seconds() + 30, stack.log_text()[-3000:]
        time.sleep(1)
    seconds = time.monotonic() - lost
    print(f"lost host -> {state.name} in {seconds:.0f} s (heartbeat {TEST_HEARTBEAT} s, within {TEST_WITHIN})")
    assert state.is_crashed() and state.message.startswith("No heartbeat for 60 s"), state
    assert not training_processes(host_a_files), "a training process was left running"
    # Read now, not at the loss: an upload under way then may still have landed.
    resumable = stored_epochs(s3_bucket)
    assert 1 <= resumable < epochs, resumable

    # The webhook added to the automation was called with the run's name.
    receiver = automation[2]
    deadline = time.monotonic() + 30
    while not receiver.bodies:
        assert time.monotonic() < deadline, stack.log_text()[-3000:]
        time.sleep(1)
    assert receiver.bodies == [f'{{"text": "{run.name} lost its host: set Crashed"}}']

    # The training is run again, on host B (A is gone), with the lost run's parameters, and finishes.
    deadline = time.monotonic() + 420
    while not (again := [r for r in flow_runs_of(stack) if r.id != run.id]) or not again[0].state.is_final():
        assert time.monotonic() < deadline, stack.log_text()[-3000:]
        assert host_b.poll() is None, stack.log_text()[-3000:]
        time.sleep(2)
    print(f"lost host -> re-run {again[0].state.name} in {time.monotonic() - lost:.0f} s")
    (rerun,) = again
    assert rerun.state.is_completed(), (rerun.state, stack.log_text()[-3000:])
    assert rerun.deployment_id == run.deployment_id
    assert rerun.parameters == {**parameters, "replaces_run": str(run.id)}
    assert f"Flow run '{rerun.name}' submitted to infrastructure" in (stack.logs / "host-b.log").read_text()

    # It says first which run it replaces and that it resumes after the epoch A's checkpoint holds, links to it...
    logs, artifacts = logs_and_artifacts(stack, rerun.id)
    headline = (
        f"Replaces run {run.name} (Crashed: No heartbeat for 60 s: the run's host or worker was lost "
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
    assert not training_processes(stack.caches["host-b"]) and not training_processes(host_a_files)
    assert sorted(r.state.name for r in flow_runs_of(stack)) == ["Completed", "Crashed"]
