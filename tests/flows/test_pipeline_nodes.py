"""Multi-node training through the work pool, on real components: a Prefect server, the deployments of
deployments/prefect.yaml, two `prefect worker`s on the `gpu` pool (each in a folder of its own, as on two hosts),
the pipeline run as a person runs it (`python -m flows.pipeline --nodes 2`), real torchrun on CPU (Gloo)."""

import os
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from uuid import uuid4

import pytest

from deployments.local import PROJECT_ROOT
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.launch.multinode import (
    ELASTIC_FINISH_GRACE_SECONDS,
    node_run_parameters,
    nodes_outcome,
    not_joined_message,
    reachable_address,
)
from tasks.registry import list_versions, read_registration
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE
from tests.flows.nodes_stack import (
    HOSTS,
    host_env,
    node_runs,
    nodes_stack,
    pipeline_command,
    run_pipeline,
    start_host,
    stop_and_fail,
)
from tests.helpers import training_processes


def test_each_node_run_gets_what_the_node_flow_takes():
    from prefect.flows import load_flow_from_entrypoint

    node_flow = load_flow_from_entrypoint(str(PROJECT_ROOT / "flows" / "train_node.py:train_node_flow"))
    params = TrainingParams(nodes="2:3")
    folders = TrainingFolders("/d/train", "/d/val", "/d/spec", "/d/model")
    parameters = node_run_parameters(folders, params, "rendezvous-1")
    assert [p["node_rank"] for p in parameters] == [0, 1, 2]
    for node in parameters:
        taken = node_flow.validate_parameters(node)
        assert (taken["folders"], taken["params"]) == (folders, params)


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
    # A host lost with its worker leaves its run "Running" for good: the finished group does not wait for it.
    finished = Completed()
    soon, later = (finished.timestamp + timedelta(seconds=s) for s in (5, ELASTIC_FINISH_GRACE_SECONDS + 1))
    assert nodes_outcome([finished, Running()], elastic=True, now=soon) == (False, None)
    assert nodes_outcome([finished, Running()], elastic=True, now=later) == (True, None)
    assert nodes_outcome([finished, Running()], elastic=False, now=later) == (False, None)


def test_the_gang_timeout_names_the_nodes_waiting_the_pool_and_its_workers():
    from prefect.client.schemas.objects import Worker, WorkerStatus
    from prefect.states import Running, Scheduled

    now = datetime.now(timezone.utc)
    workers = [
        Worker(
            name="gpu-b",
            work_pool_id=uuid4(),
            status=WorkerStatus.OFFLINE,
            last_heartbeat_time=now - timedelta(seconds=95),
        ),
        Worker(
            name="gpu-a",
            work_pool_id=uuid4(),
            status=WorkerStatus.ONLINE,
            last_heartbeat_time=now - timedelta(seconds=3),
        ),
    ]
    message = not_joined_message([Running(), Scheduled(), Scheduled()], 3, "gpu", workers, 60, now)
    assert message.startswith(
        "only 1 of 3 training nodes started within 60 s (join_timeout_s): node 1 (Scheduled), "
        "node 2 (Scheduled) still waiting for a worker of work pool 'gpu', which has "
        "gpu-a (online, last heartbeat 3 s ago), gpu-b (offline, last heartbeat 95 s ago)."
    )
    assert "start a worker on 2 more host(s)" in message
    elastic = not_joined_message([Scheduled(), Scheduled()], 1, "gpu", [], 60, now)
    assert (
        elastic.startswith("only 0 of the 1 needed (nodes 1:2) training nodes started")
        and "no worker at all" in elastic
    )


def test_node_0_publishes_its_address_towards_the_prefect_server_unless_told_another():
    assert reachable_address("http://127.0.0.1:4200/api") == "127.0.0.1"
    assert reachable_address("http://127.0.0.1:4200/api", override="gpu-0.example.org") == "gpu-0.example.org"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_home, s3_endpoint, postgres_database):
    with nodes_stack(tmp_path_factory, prefect_home, s3_endpoint, postgres_database("multinode")) as running:
        yield running


# Enough epochs for top-1 to settle (measured here: with batches of 4 the BatchNorm statistics make the first
# epochs' validation loss jump, and top-1 reaches 1.0 around epoch 11 at world size 1 and 2 alike), none stopped
# early; a node is lost in the middle of them.
EPOCHS = "16"
S3_FLAGS = ("--epochs", EPOCHS, "--patience", EPOCHS, "--learning-rate", "0.01", "--processes-per-node", "1")


@pytest.fixture(scope="module")
def two_nodes_on_s3(stack, s3_work, colour_image_dirs, tmp_path_factory):
    """The pipeline with nodes=2, work_dir and registry on S3, undisturbed: its parent has a cache of its own too."""
    result, _ = run_pipeline(
        stack, colour_image_dirs, s3_work, "colours-2nodes", *S3_FLAGS, env=host_env(tmp_path_factory.mktemp("parent"))
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:] + stack.log_text()[-3000:]
    return result


def run_files(s3_work: str, registration) -> str:
    """The S3 run folder of a registered version (named after its flow run)."""
    from tasks.storage.s3 import list_s3_names

    (run,) = {
        n.split("/")[0]
        for n in list_s3_names(f"{s3_work}/runs")
        if str(registration.flow_run_id)[:8] in n.split("/")[0]
    }
    return f"{s3_work}/runs/{run}"


def test_two_nodes_train_through_the_pool_with_no_shared_files_and_register_one_model(stack, s3_work, two_nodes_on_s3):
    from tasks.contracts.model_directory import TrainingMetrics
    from tasks.storage.s3 import list_s3_names, read_s3_object

    assert "Registered colours-2nodes version 1" in two_nodes_on_s3.stdout
    registry = f"{s3_work}/registry"
    assert list_versions(registry, "colours-2nodes") == [1]
    registration = read_registration(registry, "colours-2nodes", 1)
    assert registration.params["training"]["nodes"] == 2

    # Rank 0's host uploaded the model directory, checkpoint included; each host its rank's log.
    model = f"{run_files(s3_work, registration)}/model"
    stored = list_s3_names(model)
    assert {"model.pt", "checkpoints/last.pt", "metrics.json", "training_curves.png"} <= set(stored), stored
    metrics = TrainingMetrics.model_validate_json(read_s3_object(f"{model}/metrics.json"))
    assert metrics.world_size == 2 and len(metrics.epochs) == int(EPOCHS)
    for rank in (0, 1):
        assert (
            f"rank {rank}/2 on cpu (gloo, fp32, contiguous)"
            in read_s3_object(f"{model}/logs/driver_log_{rank}.txt").decode()
        )

    # Each node was a flow run of the deployment on the pool, a subflow of the pipeline's run, on its own worker,
    # given only S3 locations; each host fetched the images into a cache of its own (train and validation).
    runs, _, variables = node_runs(stack, registration.flow_run_id)
    assert [r.parameters["node_rank"] for r in runs] == [0, 1]
    assert all(r.state.is_completed() for r in runs), [(r.name, r.state) for r in runs]
    for run in runs:
        locations = list(run.parameters["folders"].values())
        assert all(location.startswith(s3_work) for location in locations), locations
    ran_on = [
        [h for h in HOSTS if f"Flow run '{r.name}' submitted" in (stack.logs / f"{h}.log").read_text()] for r in runs
    ]
    assert sorted(sum(ran_on, [])) == list(HOSTS), ran_on
    for host in HOSTS:
        assert len(list((stack.folders[host] / "cache" / "images").iterdir())) == 2, host
    assert not [v for v in variables if v.name.startswith("rendezvous-")], "the rendezvous record is removed"


def test_a_node_lost_mid_run_leaves_the_other_to_finish_within_a_point_of_top1(
    stack, s3_work, two_nodes_on_s3, colour_image_dirs, tmp_path
):
    """nodes 1:2 on S3, both hosts training: every training process of the host that does not serve the
    rendezvous is killed after an epoch was stored. The other restarts alone (world size 1) from the stored
    checkpoint and the pipeline completes, its top-1 within 1 point of the undisturbed nodes=2 run's. Before the
    kill, the lost host's worker processes show the launch environment of the single-node path."""
    import signal

    from tasks.allocator import ENVIRONMENT
    from tasks.contracts.model_directory import TrainingMetrics
    from tasks.storage.s3 import read_s3_object

    for host in HOSTS:
        if host not in stack.workers:
            start_host(stack, host)
    command = pipeline_command(
        colour_image_dirs,
        s3_work,
        "colours-lost",
        *S3_FLAGS,
        "--nodes",
        "1:2",
        "--max-restarts",
        "3",
        "--collective-timeout-s",
        "30",
    )
    parent = subprocess.Popen(
        command,
        env={**stack.env, **host_env(tmp_path)},
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if parent.poll() is not None or time.monotonic() > deadline:
                stop_and_fail(parent, "both hosts' trainings did not reach epoch 1 in 300 s")
            processes = {host: training_processes(stack.folders[host]) for host in HOSTS}
            launchers = {
                host: next((a for a in p.values() if "torch.distributed.run" in a), None)
                for host, p in processes.items()
            }
            if all(launchers.values()):
                output = launchers["host-a"][launchers["host-a"].index("--output") + 1]
                key = Path(output).relative_to(stack.folders["host-a"] / "cache" / "s3").as_posix()
                stored = read_s3_object(f"s3://{key}/metrics.json")
                if stored and len(TrainingMetrics.model_validate_json(stored).epochs) >= 1:
                    break
            time.sleep(0.5)
        (lost,) = [host for host, argv in launchers.items() if not any("is_host=1" in a for a in argv)]
        workers = [
            pid
            for pid, argv in processes[lost].items()
            if "torch.distributed.run" not in argv and "tasks.training.lifeline" not in argv
        ]
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{workers[0]}/environ").read_text().split("\0") if "=" in item
        )
        for pid in processes[lost]:
            os.kill(pid, signal.SIGKILL)
        output, _ = parent.communicate(timeout=400)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 0, output[-5000:] + stack.log_text()[-3000:]

    # The node path launches workers as the single-node path does (tasks.launch.torchrun_launcher.worker_environment).
    assert {k: environ.get(k) for k in ENVIRONMENT} == ENVIRONMENT
    assert (environ["PYTHONUNBUFFERED"], environ["OMP_NUM_THREADS"], environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"]) == (
        "1",
        "1",
        "1",
    )
    assert str(PROJECT_ROOT) in environ["PYTHONPATH"].split(os.pathsep)

    registry = f"{s3_work}/registry"
    registration = read_registration(registry, "colours-lost", 1)
    model = f"{run_files(s3_work, registration)}/model"
    metrics = TrainingMetrics.model_validate_json(read_s3_object(f"{model}/metrics.json"))
    assert metrics.world_size == 1 and len(metrics.epochs) == int(EPOCHS)
    assert "world size 1 (the checkpoint's was 2)" in read_s3_object(f"{model}/logs/driver_log_0.txt").decode()
    undisturbed = read_registration(registry, "colours-2nodes", 1).metrics["best_top1"]
    assert abs(registration.metrics["best_top1"] - undisturbed) <= 0.01, (
        registration.metrics["best_top1"],
        undisturbed,
    )
    runs, _, _ = node_runs(stack, registration.flow_run_id)
    assert sorted(r.state.type.value for r in runs) == ["COMPLETED", "FAILED"], [(r.name, r.state) for r in runs]


def test_the_kubernetes_gpu_job_template_fills_in_and_the_server_takes_it(stack):
    """deployments/kubernetes-gpu-job-template.json as the base job template of a `kubernetes` work pool: every
    placeholder is a variable, filled with the defaults it is a GPU job (nvidia.com/gpu limit, /dev/shm in memory,
    the node cache), and the Prefect server accepts it for a pool (no cluster here to run it on)."""
    import json

    from prefect.utilities.templating import apply_values, find_placeholders

    path = PROJECT_ROOT / "deployments" / "kubernetes-gpu-job-template.json"
    template = json.loads(path.read_text())
    variables = template["variables"]["properties"]
    assert {p.name for p in find_placeholders(template["job_configuration"])} <= set(variables)
    values = {name: spec["default"] for name, spec in variables.items() if "default" in spec}
    job = apply_values(template["job_configuration"], {**values, "image": "image-classifier:1", "name": "train-node"})
    assert job["job_manifest"]["kind"] == "Job" and job["job_manifest"]["spec"]["backoffLimit"] == 0
    pod = job["job_manifest"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (container["name"], container["image"], pod["restartPolicy"]) == (
        "prefect-job",
        "image-classifier:1",
        "Never",
    )
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}["/dev/shm"]["emptyDir"][
        "medium"
    ] == "Memory"
    assert container["env"][CACHE_VARIABLE] == "/cache"

    stack.cli("work-pool", "create", "gpu-kubernetes", "--type", "kubernetes", "--base-job-template", str(path))
    shown = stack.cli("work-pool", "inspect", "gpu-kubernetes").stdout
    assert "nvidia.com/gpu" in shown and "kubernetes" in shown
