"""Multi-node training's Prefect side (tasks/launch/multinode.py is the plain half): a node's run
(flows/train_node.py: ``find_rendezvous`` through a Prefect Variable, then ``train_node``; ``cancelled_with_its_gang``
when its gang is being cancelled), and the train task's (``run_nodes``: one flow run of the node deployment per
node through the fan-out engine, tasks/fanout/engine.py, watched under the gang's completion rule,
multinode.GangRule, until the gang is done or failed; the live ``training-nodes`` artifact)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import VariableCreate
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId, FlowRunFilterParentFlowRunId
from prefect.exceptions import ObjectAlreadyExists
from prefect.runtime import flow_run
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelled, State
from prefect.variables import Variable

from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import TrainingFailedError
from tasks.fanout.decisions import RerunRule
from tasks.fanout.engine import Child, FanOut
from tasks.launch.multinode import (
    NODE_ADDRESS_VARIABLE,
    NODE_DEPLOYMENT,
    GangRule,
    Rendezvous,
    free_port,
    node_run_parameters,
    reachable_address,
    rendezvous_key,
)
from tasks.launch.torchrun_launcher import launch_training
from tasks.launch.torchrun_output import watchable
from tasks.retrying import stage_task


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


# The train task's side: run_nodes submits the node runs and watches them.


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


class NodesTable:
    """The live ``training-nodes`` artifact (a row per node: its flow run, state and re-runs) and a log line per
    node whose state changed."""

    def __init__(self, log: Callable[[int, str], None]) -> None:
        self.log, self.seen = log, {}

    def follow(self, children: Sequence[Child]) -> None:
        for child in children:
            if child.run is not None and self.seen.get(child.key) != child.state_name:
                self.seen[child.key] = child.state_name
                self.log(logging.INFO, f"node {child.key} (flow run {child.run.name!r}): {child.state_name}")
        done = sum(child.state_name == "Completed" for child in children)
        create_table_artifact(
            key="training-nodes",
            table=[
                {"node": c.key, "flow run": c.run.name if c.run else c.flow_run_id, "state": c.state_name}
                for c in children
            ],
            description=f"{done} of {len(children)} node runs completed",
        )


def run_nodes(
    folders: TrainingFolders,
    params: TrainingParams,
    *,
    on_poll: Callable[[], None] = lambda: None,
    poll_seconds: float = 2.0,
    deployment: str = NODE_DEPLOYMENT,
) -> None:
    """Submit one node run per node through the fan-out engine, in a work queue of the gang's own with no limit
    (every node must run at once), and watch them until the gang's completion rule (``GangRule``) says training is
    done; ``on_poll`` runs on every look, for progress. A node run is never run again alone (its re-run budget is
    0): the train task's retry runs the whole gang again. Raises NodesNotJoinedError or TrainingNodeFailedError."""
    log, key = get_run_logger().log, rendezvous_key()
    table = NodesTable(log)
    fan = FanOut(
        deployment,
        label="node",
        what=f"nodes={params.nodes} trains",
        queue=key,
        rule=RerunRule(max_reruns=0),
        cancel_message="cancelled with the other nodes of its training",
        policy=GangRule(params),
        poll_seconds=poll_seconds,
    )
    try:
        with fan:
            for rank, parameters in enumerate(node_run_parameters(folders, params, key)):
                child = fan.submit(rank, parameters)
                log(
                    logging.INFO,
                    f"node {rank}: flow run {child.run.name!r} ({child.flow_run_id}) submitted to {deployment}",
                )
            table.follow(list(fan.children.values()))
            for look in fan.looks():
                if look.changed:
                    table.follow(look.children)
                on_poll()
    finally:
        Variable.unset(key)
