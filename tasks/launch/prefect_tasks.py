"""The Prefect tasks of training: ``train`` (on this host through ``torchrun_launcher.launch_training``, or on
``nodes`` hosts through the work pool: ``run_nodes``), and a multi-node training's node side, ``find_rendezvous``
and ``train_node`` (flows/train_node.py); the training-progress bar, the live training-curves picture and the
training-metrics table as artifacts. How the nodes meet and when they fail together: ``multinode.py``, which
imports no Prefect; the flow runs themselves (submitted again, cancelled): ``flow_runs.py``."""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import VariableCreate
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterTaskRunId,
    ArtifactFilterType,
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterParentFlowRunId,
)
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectAlreadyExists
from prefect.runtime import flow_run, task_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, Crashed, State
from prefect.variables import Variable

from tasks.contracts.model_directory import TRAINING_CURVES_FILE, ModelDirectory, TrainingMetrics
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import NodesNotJoinedError, TrainingFailedError, TrainingNodeFailedError
from tasks.evaluation.plots import plot_training_curves, png_markdown, significant
from tasks.launch.flow_runs import cancel_unfinished, require_deployment
from tasks.launch.multinode import (
    ELASTIC_FINISH_GRACE_SECONDS,
    NODE_ADDRESS_VARIABLE,
    NODE_DEPLOYMENT,
    Rendezvous,
    free_port,
    lost_nodes,
    node_failed_message,
    node_run_parameters,
    nodes_outcome,
    not_joined_message,
    reachable_address,
    rendezvous_key,
    started,
)
from tasks.launch.torchrun_launcher import launch_training
from tasks.launch.torchrun_output import NewEpochs, read_metrics
from tasks.retrying import stage_task
from tasks.work_dir.training_output import mirror_of


def epochs_done(metrics: TrainingMetrics | None, total: int) -> str:
    done = 0 if metrics is None else (total if metrics.stopped_early else len(metrics.epochs))
    return f"{done} of {total} epochs" + (" (stopped early)" if metrics is not None and metrics.stopped_early else "")


def publish_training_curves(metrics: TrainingMetrics, path: Path, description: str) -> None:
    """Draw the curves to ``path`` and publish them as the next version of artifact ``training-curves``: one
    key, so the UI shows the latest picture, and its history is the training's."""
    plot_training_curves(metrics, path)
    create_markdown_artifact(
        key="training-curves",
        markdown=f"### Training curves\n\n{png_markdown(path, 'loss and accuracy by epoch')}\n",
        description=description,
    )


def progress_artifact(total_epochs: int) -> UUID:
    """This task run's ``training-progress`` artifact: created on the first attempt, carried on by a retry
    (a new one per attempt would leave the first stuck at the fraction it had reached)."""
    task_run_id = task_run.id
    if task_run_id is not None:
        with get_client(sync_client=True) as client:
            earlier = client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id]), type=ArtifactFilterType(any_=["progress"])
                ),
                limit=1,
            )
        if earlier:
            return earlier[0].id
    return create_progress_artifact(0.0, key="training-progress", description=epochs_done(None, total_epochs))


# One retry: the worker resumes from its last checkpoint, so a retry costs at most one epoch.
@stage_task(retries=1, retry_delay_seconds=5)
def train(folders: TrainingFolders, params: TrainingParams) -> str:
    """Artifacts ``training-progress`` (live, "3 of 5 epochs"), ``training-curves`` (live too: a new version
    per epoch seen) and ``training-metrics``."""
    logger = get_run_logger()
    progress = progress_artifact(params.epochs)

    def on_metrics(metrics: TrainingMetrics) -> None:
        done = params.epochs if metrics.stopped_early else len(metrics.epochs)
        update_progress_artifact(
            progress, 100.0 * done / params.epochs, description=epochs_done(metrics, params.epochs)
        )
        if metrics.epochs:  # the curves so far, beside the progress bar; output_dir may be on S3: draw aside
            with tempfile.TemporaryDirectory(prefix="training-curves-") as scratch:
                publish_training_curves(
                    metrics, Path(scratch) / TRAINING_CURVES_FILE, f"so far: {epochs_done(metrics, params.epochs)}"
                )

    mirror = mirror_of(folders.output_dir)
    if params.max_nodes == 1:
        model_dir = launch_training(
            folders,
            params,
            run_id=Path(folders.output_dir).parent.name,
            log=watchable(logger.log),
            on_metrics=on_metrics,
        )
    else:
        # One flow run per node through the work pool (tasks/launch/multinode.py); they write into output_dir, watched here.
        read = mirror.remote_metrics if mirror else lambda: read_metrics(Path(folders.output_dir))
        run_nodes(folders, params, on_poll=NewEpochs(read, on_metrics).poll)
        # On S3: the stages after training read the model from this host's copy.
        model_dir = ModelDirectory(mirror.download_all() if mirror else folders.output_dir)
    metrics = model_dir.metrics()
    update_progress_artifact(progress, 100.0, description=epochs_done(metrics, params.epochs))
    curves = model_dir.root / TRAINING_CURVES_FILE
    summary = f"best top-1 {metrics.best_top1:.4g} at epoch {metrics.best_epoch} of {len(metrics.epochs)}" + (
        " (stopped early)" if metrics.stopped_early else ""
    )
    publish_training_curves(metrics, curves, summary)
    if mirror:
        mirror.upload(TRAINING_CURVES_FILE)
    create_table_artifact(
        key="training-metrics",
        table=[{name: significant(value) for name, value in epoch.model_dump().items()} for epoch in metrics.epochs],
        description=f"{summary}; curves in {curves.resolve()}",
    )
    return str(model_dir.root)


def watchable(log: Callable[[int, str], None]) -> Callable[[int, str], None]:
    """``log`` for torchrun's lines, each made safe for `prefect deployment run --watch`, which prints log messages
    as rich markup: a "[/…]" in a line (PyTorch's gloo errors begin with their source file so) is a closing tag
    without an opening one, and the watch stopped on it (MarkupError) while the run went on. Escaped as rich
    escapes it; the ranks' own log files keep the line as it was."""
    return lambda level, line: log(level, line.replace("[/", "\\[/"))


@stage_task(retries=0)
def train_node(folders: TrainingFolders, params: TrainingParams, rendezvous: Rendezvous) -> str:
    """One node's launcher of a multi-node training (flows/train_node.py); not retried alone: the train task
    that submitted the nodes retries them all together. A failure while its gang is being cancelled ends the
    node's run Cancelled (``cancelled_with_its_gang``)."""
    node_params = params.model_copy(update={"rendezvous_endpoint": rendezvous.endpoint})
    model_dir = launch_training(
        folders,
        node_params,
        run_id=rendezvous.id,
        is_host=rendezvous.is_host,
        log=watchable(get_run_logger().log),
    )
    return str(model_dir.root)


def gang_cancellation(client, node_run) -> State | None:
    """The Cancelling or Cancelled state of ``node_run`` or of another node run of its training (a subflow of the
    same flow run with the same rendezvous key), if any."""
    runs = [node_run]
    if node_run.parent_task_run_id is not None:
        parent = client.read_task_run(node_run.parent_task_run_id).flow_run_id
        runs += client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]),
                deployment_id=FlowRunFilterDeploymentId(any_=[node_run.deployment_id]),
            )
        )
    key = node_run.parameters.get("rendezvous_key")
    return next(
        (
            run.state
            for run in runs
            if run.parameters.get("rendezvous_key") == key
            and run.state is not None
            and (run.state.is_cancelling() or run.state.is_cancelled())
        ),
        None,
    )


def cancelled_with_its_gang(node_rank: int, failed: TrainingFailedError) -> State:
    """A node run's end when its training failed: Cancelled if its gang is being cancelled, else ``failed`` raised
    again. The train stage (or the server, when the pipeline's run is cancelled) sets every node run Cancelling,
    and each host's worker stops its own: the first node stopped takes the others' training down with it (gloo:
    "Connection reset by peer", and torchrun exits) before their own workers stop them. Such a node failed only
    because its gang is being cancelled, and ends Cancelled as its gang does, not Failed (or left Cancelling, as
    the server takes nothing but Cancelled from Cancelling, with no process left for its worker to stop)."""
    with get_client(sync_client=True) as client:
        cancelled = gang_cancellation(client, client.read_flow_run(flow_run.id))
    if cancelled is None:
        raise failed
    message = (
        f"node {node_rank}: its training ended with its gang's cancellation ({cancelled.message or cancelled.name}): "
        f"{str(failed).splitlines()[0]}"
    )
    get_run_logger().info(message)
    return Cancelled(message=message)


# Multi-node: a node's side (flows/train_node.py: find_rendezvous, then train_node above), then the train task's
# (run_nodes submits the node runs and watches them).


def claim_rendezvous(key: str, endpoint: str) -> tuple[str, bool]:
    """Publish ``endpoint`` as the rendezvous unless another node did first (the server creates a Variable name
    once): the endpoint to use, and whether it is this node's."""
    with get_client(sync_client=True) as client:
        try:
            client.create_variable(VariableCreate(name=key, value=endpoint))
            return endpoint, True
        except ObjectAlreadyExists:
            return client.read_variable_by_name(key).value, False


@stage_task(retries=0)
def find_rendezvous(params: TrainingParams, node_rank: int, key: str) -> Rendezvous:
    """The first node to start serves the rendezvous on its address towards the Prefect server and a free port;
    the others join it."""
    rendezvous_id = params.rendezvous_id or key
    if params.rendezvous_endpoint:
        return Rendezvous(endpoint=params.rendezvous_endpoint, id=rendezvous_id, is_host=None)
    address = reachable_address(PREFECT_API_URL.value(), os.environ.get(NODE_ADDRESS_VARIABLE))
    endpoint, is_host = claim_rendezvous(key, f"{address}:{free_port()}")
    role = "serves" if is_host else "joins"
    get_run_logger().info("node %d %s the rendezvous at %s (Prefect Variable %r)", node_rank, role, endpoint, key)
    return Rendezvous(endpoint=endpoint, id=rendezvous_id, is_host=is_host)


def submit_node(deployment: str, rank: int, parameters: dict, log):
    """A flow run of ``deployment`` for one node, a subflow of the calling task's flow run; not waited for."""
    run = run_deployment(
        deployment, parameters=parameters, timeout=0, flow_run_name=f"{flow_run.get_name() or 'train'}-node-{rank}"
    )
    log(logging.INFO, f"node {rank}: flow run {run.name!r} ({run.id}) submitted to {deployment}")
    return run


def check_nodes(client, runs: Sequence, deployment: str, params: TrainingParams, joining: bool) -> bool:
    """One look at the node runs: True once training is done (``nodes_outcome``); raises when a node's end fails
    it, or when ``joining`` is over (``join_timeout_s`` passed) and fewer than the nodes needed have started."""
    states = [run.state for run in runs]
    done, failed = nodes_outcome(states, elastic=params.min_nodes < params.max_nodes)
    if failed is not None:
        run = runs[failed]
        message = node_failed_message(failed, run.name, run.state)
        raise TrainingNodeFailedError(message, returncode=None, rank=None, log_tail=run.state.message or "")
    if done:
        return True
    if not joining and sum(started(state) for state in states) < params.min_nodes:
        pool = client.read_deployment_by_name(deployment).work_pool_name
        workers = client.read_workers_for_work_pool(pool)
        now = datetime.datetime.now(datetime.timezone.utc)
        raise NodesNotJoinedError(
            not_joined_message(states, params.min_nodes, pool, workers, params.join_timeout_s, now)
        )
    return False


def end_lost_nodes(client, runs: Sequence, log) -> None:
    """Set the runs of hosts lost with their worker (``lost_nodes``) to Crashed through the API: no worker can,
    and a Cancelling state would wait for one."""
    for rank in lost_nodes([run.state for run in runs]):
        message = (
            f"node {rank}: still {runs[rank].state.name} {ELASTIC_FINISH_GRACE_SECONDS:g} s after another node of "
            "its group completed: its host was lost with its worker; ended by the train stage"
        )
        client.set_flow_run_state(runs[rank].id, Crashed(message=message), force=True)
        log(logging.WARNING, message)


def run_nodes(
    folders: TrainingFolders,
    params: TrainingParams,
    *,
    on_poll: Callable[[], None] = lambda: None,
    poll_seconds: float = 2.0,
    deployment: str = NODE_DEPLOYMENT,
) -> None:
    """Submit one node run per node and watch them to the end (see the module's docstring); ``on_poll`` runs on
    every look, for progress. Raises NodesNotJoinedError or TrainingNodeFailedError."""
    log = get_run_logger().log
    key = rendezvous_key()
    with get_client(sync_client=True) as client:
        require_deployment(client, deployment, f"nodes={params.nodes} trains")
        runs: list = []
        try:
            parameters = node_run_parameters(folders, params, key)
            for rank, node_parameters in enumerate(parameters):
                runs.append(submit_node(deployment, rank, node_parameters, log))
            joined_by = time.monotonic() + params.join_timeout_s
            seen: dict[int, str] = {}
            while True:
                runs = [client.read_flow_run(run.id) for run in runs]
                for rank, run in enumerate(runs):
                    if seen.get(rank) != run.state.name:
                        seen[rank] = run.state.name
                        log(logging.INFO, f"node {rank} (flow run {run.name!r}): {run.state.name}")
                on_poll()
                if check_nodes(client, runs, deployment, params, joining=time.monotonic() < joined_by):
                    return
                time.sleep(poll_seconds)
        finally:
            if params.min_nodes < params.max_nodes:
                end_lost_nodes(client, [client.read_flow_run(run.id) for run in runs], log)
            ended = cancel_unfinished(client, runs, "cancelled with the other nodes of its training")
            forced = [f"{r.name}" for r in ended if "no worker ended it" in (r.state.message or "")]
            if forced:
                log(logging.WARNING, f"node runs set Cancelled through the API, no worker having ended them: {forced}")
            Variable.unset(key)
