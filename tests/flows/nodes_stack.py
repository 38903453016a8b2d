"""The multi-node tests' stack: a Prefect server with the pools and deployments `make deploy` makes, one `prefect
worker` per "host" on the `gpu` pool (a folder and a cache of its own each), the moto server standing for S3; and
the pipeline run as a person runs it. Each test file that uses it starts its own (``nodes_stack``), so that the
files run in parallel."""

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from deployments.local import PROJECT_ROOT, PrefectStack
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE
from tests import helpers
from tests.helpers import s3_settings

HOSTS = ("host-a", "host-b")


def host_env(folder) -> dict[str, str]:
    """A "host"'s own cache (tasks/storage/work_dir_on_s3.py): nothing it fetches or trains is seen by another."""
    return {CACHE_VARIABLE: str(folder / "cache")}


@contextmanager
def nodes_stack(tmp_path_factory, prefect_home, s3_endpoint, database_url: str) -> Iterator[PrefectStack]:
    """A server (on PostgreSQL: ``database_url``), the pools and deployments as `make deploy` makes them, and one worker per "host" (limit 1), each
    in a folder of its own with a cache of its own; the moto server stands for S3."""
    # Two "hosts" share this machine's cores: one compute thread per training process.
    settings = {
        "PREFECT_WORKER_CANCELLATION_POLL_SECONDS": "2",
        "OMP_NUM_THREADS": "1",
        **s3_settings(s3_endpoint),
    }
    with PrefectStack(home=prefect_home("prefect-home"), database_url=database_url, settings=settings) as running:
        running.deploy()
        running.workers, running.folders = {}, {}
        for host in HOSTS:
            running.folders[host] = tmp_path_factory.mktemp(host)
            start_host(running, host)
        yield running


def start_host(stack, host: str) -> None:
    folder = stack.folders[host]
    stack.workers[host] = stack.start_worker("gpu", host, limit=1, cwd=folder, env=host_env(folder))


def pipeline_command(colour_image_dirs, work: str, name: str, *flags: str) -> list[str]:
    """`python -m flows.pipeline` with 2 nodes (unless ``flags`` say otherwise): run against the stack's server, the
    parent flow runs here and its nodes on the pool; registry and runs under ``work`` (a folder or an S3 URI)."""
    return helpers.pipeline_command(
        *colour_image_dirs, name, work, "--epochs", "1", "--batch-size", "4", "--device", "cpu", "--nodes", "2", *flags
    )


def run_pipeline(
    stack, colour_image_dirs, work, name: str, *flags: str, env=None
) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    command = pipeline_command(colour_image_dirs, str(work), name, *flags)
    result = subprocess.run(
        command, env={**stack.env, **(env or {})}, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=500
    )
    return result, time.monotonic() - started


def start_pipeline(stack, command: list[str], folder: Path) -> subprocess.Popen:
    """``command`` started against the stack's server as a host of its own (its cache under ``folder``), its
    output (stderr included) readable as text."""
    return subprocess.Popen(
        command,
        env={**stack.env, **host_env(folder)},
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop_and_fail(parent: subprocess.Popen, why: str) -> None:
    """Fail the test with the pipeline's output: killed first, as reading a running process's output waits for
    its end."""
    if parent.poll() is None:
        parent.kill()
    output, _ = parent.communicate(timeout=60)
    raise AssertionError(f"{why}\n{output[-5000:]}")


def run_folders(work: Path) -> list[Path]:
    """The run folders in a work dir (``logs/`` holds the command line's log files)."""
    return [p for p in work.iterdir() if p.name != "logs"]


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
