"""Multi-node training through the work pool, on real components: a Prefect server, the deployments of
deployments/prefect.yaml, two `prefect worker`s on the `gpu` pool (each in a folder of its own, as on two hosts),
the pipeline run as a person runs it (`python -m flows.pipeline --nodes 2`), real torchrun on CPU (Gloo)."""

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from uuid import uuid4

import pytest

from deployments.local import PROJECT_ROOT, PrefectStack
from tasks.model_directory import ModelDirectory, driver_log_path
from tasks.nodes import node_run_parameters, nodes_outcome, not_joined_message, reachable_address
from tasks.registry import list_versions, read_registration
from tasks.training.config import TrainingParams
from tests.helpers import processes_of

HOSTS = ("host-a", "host-b")


def test_each_node_run_gets_what_the_node_flow_takes():
    from prefect.flows import load_flow_from_entrypoint

    node_flow = load_flow_from_entrypoint(str(PROJECT_ROOT / "flows" / "train_node.py:train_node_flow"))
    params = TrainingParams(nodes="2:3")
    parameters = node_run_parameters("/d/train", "/d/val", "/d/spec", "/d/model", params, "rendezvous-1")
    assert [p["node_rank"] for p in parameters] == [0, 1, 2]
    for node in parameters:
        assert node_flow.validate_parameters(node)["params"] == params


def test_nodes_is_a_number_or_torchruns_min_max():
    assert (TrainingParams(nodes="2").nodes, TrainingParams(nodes=" 1:4 ").nodes) == (2, "1:4")
    assert (TrainingParams(nodes="1:4").min_nodes, TrainingParams(nodes="1:4").max_nodes) == (1, 4)
    for bad in (0, "0:2", "3:2", "two", "1:2:3"):
        with pytest.raises(ValueError, match="nodes is"):
            TrainingParams(nodes=bad)


def test_fixed_nodes_fail_with_any_node_and_elastic_ones_carry_on_without_it():
    from prefect.states import Cancelled, Completed, Failed, Running, Scheduled

    assert nodes_outcome([Running(), Failed()], elastic=False) == (False, 1)
    assert nodes_outcome([Completed(), Running()], elastic=False) == (False, None)
    assert nodes_outcome([Completed(), Completed()], elastic=False) == (True, None)
    assert nodes_outcome([Running(), Failed(), Scheduled()], elastic=True) == (False, None)
    assert nodes_outcome([Completed(), Failed(), Scheduled()], elastic=True) == (True, None)
    assert nodes_outcome([Failed(), Cancelled(), Scheduled()], elastic=True) == (False, 0)


def test_the_gang_timeout_names_the_nodes_waiting_the_pool_and_its_workers():
    from prefect.client.schemas.objects import Worker, WorkerStatus
    from prefect.states import Running, Scheduled

    now = datetime.now(timezone.utc)
    workers = [Worker(name="gpu-b", work_pool_id=uuid4(), status=WorkerStatus.OFFLINE, last_heartbeat_time=now - timedelta(seconds=95)),
               Worker(name="gpu-a", work_pool_id=uuid4(), status=WorkerStatus.ONLINE, last_heartbeat_time=now - timedelta(seconds=3))]  # fmt: skip
    message = not_joined_message([Running(), Scheduled(), Scheduled()], 3, "gpu", workers, 60, now)
    assert message.startswith("only 1 of 3 training nodes started within 60 s (join_timeout_s): node 1 (Scheduled), "
                              "node 2 (Scheduled) still waiting for a worker of work pool 'gpu', which has "
                              "gpu-a (online, last heartbeat 3 s ago), gpu-b (offline, last heartbeat 95 s ago).")  # fmt: skip
    assert "start a worker on 2 more host(s)" in message
    elastic = not_joined_message([Scheduled(), Scheduled()], 1, "gpu", [], 60, now)
    assert elastic.startswith("only 0 of the 1 needed (nodes 1:2) training nodes started") and "no worker at all" in elastic


def test_node_0_publishes_its_address_towards_the_prefect_server_unless_told_another():
    assert reachable_address("http://127.0.0.1:4200/api") == "127.0.0.1"
    assert reachable_address("http://127.0.0.1:4200/api", override="gpu-0.example.org") == "gpu-0.example.org"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A server, the pools and deployments as `make deploy` makes them, and one worker per "host" (limit 1)."""
    # Two "hosts" share this machine's cores: one compute thread per training process.
    settings = {"PREFECT_WORKER_CANCELLATION_POLL_SECONDS": "2", "OMP_NUM_THREADS": "1"}
    with PrefectStack(home=tmp_path_factory.mktemp("prefect-home"), settings=settings) as running:
        for pool in ("gpu", "default"):
            running.cli("work-pool", "create", pool, "--type", "process")
        deployed = subprocess.run([sys.executable, "-m", "deployments.deploy"], env=running.env, cwd=PROJECT_ROOT,
                                  capture_output=True, text=True, timeout=300)  # fmt: skip
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        running.workers = {}
        for host in HOSTS:
            folder = tmp_path_factory.mktemp(host)
            running.workers[host] = running.start_worker("gpu", host, limit=1, cwd=folder)
        yield running


def pipeline_command(colour_image_dirs, tmp_path, name: str, *flags: str) -> list[str]:
    """`python -m flows.pipeline` with 2 nodes (unless ``flags`` say otherwise): run against the stack's server, the
    parent flow runs here and its nodes on the pool."""
    train, val = colour_image_dirs
    return [sys.executable, "-m", "flows.pipeline", "--train-data", str(train), "--validation-data", str(val),
            "--model-name", name, "--registry", str(tmp_path / "registry"), "--work-dir", str(tmp_path / "runs"),
            "--epochs", "1", "--batch-size", "4", "--device", "cpu", "--nodes", "2", *flags]  # fmt: skip


def run_pipeline(stack, colour_image_dirs, tmp_path, name: str, *flags: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    command = pipeline_command(colour_image_dirs, tmp_path, name, *flags)
    result = subprocess.run(command, env=stack.env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=500)
    return result, time.monotonic() - started


def node_runs(stack, parent_flow_run_id=None):
    """The runs of the train-node deployment (of one parent flow run when given), node 0 first."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("train-node/train-node")
        runs = [r for r in client.read_flow_runs() if r.deployment_id == deployment.id]
        parents = {r.id: client.read_task_run(r.parent_task_run_id).flow_run_id for r in runs if r.parent_task_run_id}
        variables = client.read_variables()
    if parent_flow_run_id is not None:
        runs = [r for r in runs if str(parents.get(r.id)) == str(parent_flow_run_id)]
    return sorted(runs, key=lambda r: r.parameters["node_rank"]), parents, variables


def test_two_nodes_train_through_the_pool_and_register_one_model(stack, colour_image_dirs, tmp_path):
    result, _ = run_pipeline(stack, colour_image_dirs, tmp_path, "colours-2nodes", "--processes-per-node", "1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:] + stack.log_text()[-3000:]
    assert "Registered colours-2nodes version 1" in result.stdout

    registry = tmp_path / "registry"
    assert list_versions(registry, "colours-2nodes") == [1]
    registration = read_registration(registry, "colours-2nodes", 1)
    assert registration.params["training"]["nodes"] == 2
    (model_dir,) = [ModelDirectory(p) for p in (tmp_path / "runs").glob("*/model")]
    assert model_dir.metrics().world_size == 2
    for rank in (0, 1):
        assert "rank %d/2 on cpu (gloo, fp32, contiguous)" % rank in driver_log_path(model_dir.root, rank).read_text()

    # Each node was a flow run of the deployment on the pool, a subflow of the pipeline's run, on its own worker.
    runs, _, variables = node_runs(stack, registration.flow_run_id)
    assert [r.parameters["node_rank"] for r in runs] == [0, 1]
    assert all(r.state.is_completed() for r in runs), [(r.name, r.state) for r in runs]
    ran_on = [[h for h in HOSTS if f"Flow run '{r.name}' submitted" in (stack.logs / f"{h}.log").read_text()] for r in runs]
    assert sorted(sum(ran_on, [])) == list(HOSTS), ran_on
    assert not [v for v in variables if v.name.startswith("rendezvous-")], "the rendezvous record is removed"


def test_stopping_the_parent_run_cancels_every_node_and_leaves_nothing_running(stack, colour_image_dirs, tmp_path):
    """SIGTERM to the parent flow's process (what its worker sends when the run is cancelled) while both nodes
    train: the train task cancels both node runs, waits for them to end, and every training process is gone."""
    import signal

    command = pipeline_command(colour_image_dirs, tmp_path, "colours-stopped", "--epochs", "200", "--patience", "300")
    parent = subprocess.Popen(command, env=stack.env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not [p for p in (tmp_path / "runs").glob("*/model/metrics.json")]:
            assert parent.poll() is None and time.monotonic() < deadline, parent.stdout.read()[-5000:]
            time.sleep(0.5)
        os.kill(parent.pid, signal.SIGTERM)
        output, _ = parent.communicate(timeout=200)
    finally:
        if parent.poll() is None:
            parent.kill()
    (run_dir,) = (tmp_path / "runs").iterdir()
    runs, _, _ = node_runs(stack)
    mine = [r for r in runs if r.parameters["output_dir"] == str(run_dir / "model")]
    assert len(mine) == 2 and all(r.state.is_cancelled() for r in mine), [(r.name, r.state) for r in mine] + [output[-3000:]]
    assert not processes_of(run_dir), "a training process was left running"


def test_too_few_workers_fail_the_gang_within_its_join_timeout_and_leave_nothing_running(stack, colour_image_dirs, tmp_path):
    stack.stop_process(stack.workers.pop("host-b"))
    join_timeout = 20
    result, seconds = run_pipeline(stack, colour_image_dirs, tmp_path, "colours-gang", "--join-timeout-s", str(join_timeout))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "NodesNotJoinedError: only 1 of 2 training nodes started within 20 s (join_timeout_s)" in output, output[-5000:]
    assert "work pool 'gpu'" in output and "host-a" in output and "Every node run was cancelled; none trained" in output
    # Conversion and the flow's start take some seconds; cancelling the node that started, a few more.
    assert seconds < join_timeout + 120, seconds

    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not processes_of(run_dir), "a training process was left running"
    assert not (run_dir / "model" / "metrics.json").exists(), "a node trained alone"
    runs, parents, _ = node_runs(stack)
    mine = [r for r in runs if r.parameters["output_dir"] == str(run_dir / "model")]
    assert len(mine) == 2 and all(r.state.is_cancelled() for r in mine), [(r.name, r.state) for r in mine]


def test_elastic_nodes_train_with_the_minimum_and_take_in_a_node_that_comes_late(stack, colour_image_dirs, tmp_path):
    """nodes 1:2 with one worker: node 0 trains alone (world size 1); a second host's worker starts mid-training,
    its node joins, torchrun rescales to world size 2 and the run resumes from the last checkpoint."""
    if "host-b" in stack.workers:
        stack.stop_process(stack.workers.pop("host-b"))
    command = pipeline_command(colour_image_dirs, tmp_path, "colours-elastic", "--nodes", "1:2", "--epochs", "60",
                               "--patience", "100", "--processes-per-node", "1")  # fmt: skip
    parent = subprocess.Popen(command, env=stack.env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (metrics := [ModelDirectory(p).metrics() for p in (tmp_path / "runs").glob("*/model")
                               if (p / "metrics.json").is_file()]):  # fmt: skip
            assert parent.poll() is None and time.monotonic() < deadline, parent.stdout.read()[-5000:]
            time.sleep(0.5)
        assert metrics[0].world_size == 1 and len(metrics[0].epochs) < 60, "training did not start alone"
        stack.workers["host-b"] = stack.start_worker("gpu", "host-b", limit=1, cwd=tmp_path)
        output, _ = parent.communicate(timeout=400)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 0, output[-5000:] + stack.log_text()[-3000:]

    (model_dir,) = [ModelDirectory(p) for p in (tmp_path / "runs").glob("*/model")]
    assert model_dir.metrics().world_size == 2 and len(model_dir.metrics().epochs) == 60
    logs = "".join(driver_log_path(model_dir.root, rank).read_text() for rank in (0, 1))
    assert "world size 2 (the checkpoint's was 1)" in logs
    assert list_versions(tmp_path / "registry", "colours-elastic") == [1]
    runs, _, _ = node_runs(stack, read_registration(tmp_path / "registry", "colours-elastic", 1).flow_run_id)
    assert all(r.state.is_completed() for r in runs), [(r.name, r.state) for r in runs]
