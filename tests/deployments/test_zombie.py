"""A lost host, on real components: a Prefect server with the deployments and automation `make deploy` makes, one
`prefect worker` on the `gpu` pool, a training run of `train-pipeline/retrain-digits`; the worker's whole process
tree is killed mid-training, as a powered-off host would be, and the automation sets the run Crashed."""

import asyncio
import http.server
import os
import signal
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from deployments.automations import (
    HEARTBEAT_SETTING,
    MISSED_HEARTBEATS,
    ZOMBIE_AUTOMATION,
    ensure_zombie_automation,
    heartbeat_seconds,
)
from deployments.local import PROJECT_ROOT, PrefectStack
from tests.helpers import training_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEPLOYMENT = "train-pipeline/retrain-digits"
# The test's runs beat at the least Prefect allows, and are crashed after 2 missed beats, not make deploy's 3 × 60 s.
TEST_HEARTBEAT = 30
TEST_WITHIN = timedelta(seconds=2 * TEST_HEARTBEAT)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A server, `make deploy`'s pools, deployments and automation, one worker (limit 1) in a folder of its own."""
    settings = {"OMP_NUM_THREADS": "1"}
    with PrefectStack(home=tmp_path_factory.mktemp("prefect-home"), settings=settings) as running:
        running.deploy()
        running.worker = running.start_worker("gpu", "host-a", limit=1, cwd=tmp_path_factory.mktemp("host-a"))
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


def test_a_run_whose_host_is_lost_is_set_crashed_once_its_heartbeats_stop(
    stack, automation, colour_image_dirs, tmp_path
):
    train, val = colour_image_dirs
    parameters = {
        "train_data": str(train),
        "validation_data": str(val),
        "model_name": "colours-lost-host",
        "model": {"pretrained": False},
        # More epochs than the test lasts: the run is lost in the middle of them.
        "training": {"epochs": 5000, "patience": 5000, "batch_size": 4, "processes_per_node": 1},
        "registry": str(tmp_path / "registry"),
        "work_dir": str(tmp_path / "runs"),
    }
    # The run's own job variables replace the deployment's env: the deployment's, with the test's heartbeat.
    env = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", HEARTBEAT_SETTING: str(TEST_HEARTBEAT)}
    with client_for(stack) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
        run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters, job_variables={"env": env})
    deadline = time.monotonic() + 300
    # Lost after its first epoch, as in the issue: a checkpoint written, the run beating.
    while not (list((tmp_path / "runs").glob("*/model/checkpoints/last.pt")) and heartbeats_of(stack, run.id)):
        assert time.monotonic() < deadline, stack.log_text()[-3000:]
        assert stack.worker.poll() is None, stack.log_text()[-3000:]
        time.sleep(1)

    # The host is lost: its worker's process tree and the training it started (torchrun's workers run in sessions
    # of their own) stop at once, stopped first so that none sees another die.
    tree = set(process_tree(stack.worker.pid)) | set(training_processes(tmp_path / "runs"))
    assert stack.worker.pid in tree and training_processes(tmp_path / "runs"), tree
    for pid in tree:
        os.kill(pid, signal.SIGSTOP)
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    lost = time.monotonic()

    # Crashed once no heartbeat came for TEST_WITHIN after the last one: at most that long after the loss, plus
    # the server's evaluation pace (5 s) and margin.
    with client_for(stack) as client:
        while (state := client.read_flow_run(run.id).state).is_running():
            assert time.monotonic() - lost < TEST_WITHIN.total_seconds() + 30, stack.log_text()[-3000:]
            time.sleep(1)
    seconds = time.monotonic() - lost
    print(f"lost host -> {state.name} in {seconds:.0f} s (heartbeat {TEST_HEARTBEAT} s, within {TEST_WITHIN})")
    assert state.is_crashed() and state.message.startswith("No heartbeat for 60 s"), state
    assert not training_processes(tmp_path / "runs"), "a training process was left running"

    # The webhook added to the automation was called with the run's name.
    receiver = automation[2]
    deadline = time.monotonic() + 30
    while not receiver.bodies:
        assert time.monotonic() < deadline, stack.log_text()[-3000:]
        time.sleep(1)
    assert receiver.bodies == [f'{{"text": "{run.name} lost its host: set Crashed"}}']
