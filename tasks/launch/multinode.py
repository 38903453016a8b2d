"""Multi-node training through the work pool: one flow run of the ``train-node`` deployment per node.

With ``nodes > 1`` (or ``min:max``) the train task (tasks/launch/train.py) submits one run of the node deployment
(flows/train_node.py) per node, as subflows of its own flow run: the UI shows each node's run, state and logs under
the train task, and whichever worker of the deployment's pool (``gpu``, one per GPU host) is free picks each up.
Every node trains through ``tasks.launch.torchrun_launcher.launch_training``, the one launch path, and all meet at one c10d
rendezvous: the first node to start takes a free port on its host, publishes ``host:port`` as a Prefect Variable
(created once: the server refuses a second) and serves the rendezvous there; the others read it and join
(``rendezvous_endpoint`` set by hand overrides it).

Gang: unless enough node runs (``nodes``, or ``min`` of ``min:max``) have started within ``join_timeout_s``,
every run is cancelled and the task fails with ``NodesNotJoinedError`` naming the pool and its workers. With a
fixed ``nodes`` a node run that ends without completing cancels every other one; with ``min:max`` the others
carry on (torchrun re-forms the group from the last checkpoint, given ``max_restarts``), runs still waiting for a
worker may join late (torchrun rescales), and those that never started are cancelled when training is over.
However the train task ends (done, failed, cancelled, interrupted), it cancels every node run still going and
returns or raises only once they have all ended, so no node trains alone. The server cancels them too if the
parent flow run is cancelled (they are its subflows).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel

from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import NodesNotJoinedError, PipelineInputError, TrainingNodeFailedError

NODE_DEPLOYMENT = "train-node/train-node"
# Long enough for a worker to see a cancellation and stop its flow run's processes.
CANCEL_WAIT_SECONDS = 120.0
# An address other hosts reach this one at, when the one facing the Prefect server is not it (NAT, several networks).
NODE_ADDRESS_VARIABLE = "TRAIN_NODE_ADDRESS"
# Elastic: how long after the first node run completes the others may still be going (uploading their logs).
ELASTIC_FINISH_GRACE_SECONDS = 120.0


class Rendezvous(BaseModel):
    """Where a node's launcher meets the others: torchrun's c10d endpoint and id, and whether it serves the store."""

    endpoint: str
    id: str
    is_host: bool | None


def rendezvous_key() -> str:
    """A new name per launch of the nodes (a Prefect Variable name: lowercase letters, digits, dashes)."""
    return f"rendezvous-{uuid.uuid4().hex[:16]}"


def reachable_address(api_url: str | None, override: str | None = None) -> str:
    """This host's address on the network that reaches the Prefect server: every node reaches that server, so the
    other nodes most likely reach this address too. No packet is sent (a UDP socket only picks its route)."""
    if override:
        return override
    parts = urlsplit(api_url or "")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((parts.hostname or "127.0.0.1", parts.port or 443))
            return probe.getsockname()[0]
    except OSError:
        return socket.getfqdn()


def free_port() -> int:
    """A port free on every interface of this host now; torchrun binds it moments later."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def node_run_parameters(folders: TrainingFolders, params: TrainingParams, key: str) -> list[dict]:
    """The parameters of each node's flow run (flows/train_node.py): one per node, up to ``max`` of ``min:max``."""
    shared = dict(
        folders=dataclasses.asdict(folders),
        params=params.model_dump(mode="json"),
        rendezvous_key=key,
    )
    return [{**shared, "node_rank": rank} for rank in range(params.max_nodes)]


def started(state) -> bool:
    return state is not None and (state.is_running() or state.is_final())


def describe_workers(workers: Sequence, now: datetime.datetime) -> str:
    if not workers:
        return "no worker at all"
    described = []
    for worker in sorted(workers, key=lambda w: w.name):
        beat = worker.last_heartbeat_time
        seen = f"last heartbeat {(now - beat).total_seconds():.0f} s ago" if beat else "no heartbeat yet"
        described.append(f"{worker.name} ({str(worker.status.value).lower()}, {seen})")
    return ", ".join(described)


def not_joined_message(
    states: Sequence, needed: int, pool: str, workers: Sequence, timeout_s: float, now: datetime.datetime
) -> str:
    joined = [rank for rank, state in enumerate(states) if started(state)]
    waiting = [f"node {rank} ({state.name})" for rank, state in enumerate(states) if rank not in joined]
    of = f"{len(states)}" if needed == len(states) else f"the {needed} needed (nodes {needed}:{len(states)})"
    return (
        f"only {len(joined)} of {of} training nodes started within {timeout_s:g} s (join_timeout_s): "
        f"{', '.join(waiting)} still waiting for a worker of work pool {pool!r}, which has "
        f"{describe_workers(workers, now)}. Each GPU host's worker takes one run at a time: start a worker on "
        f"{needed - len(joined)} more host(s) (make worker POOL={pool}), wait for theirs to finish, or lower nodes. "
        "Every node run was cancelled; none trained."
    )


def node_failed_message(rank: int, run_name: str, state) -> str:
    return (
        f"training node {rank} (flow run {run_name!r}) ended {state.name}: {state.message or 'no message'}; "
        "every other node run was cancelled"
    )


def nodes_outcome(states: Sequence, elastic: bool, now: datetime.datetime | None = None) -> tuple[bool, int | None]:
    """(done, the node whose failure fails the training) from the node runs' states.

    Fixed nodes: done once all completed; any node ending otherwise fails it. Elastic (``min:max``): done once one
    completed and no started run is still going (runs that never started are cancelled), or once one completed
    ``ELASTIC_FINISH_GRACE_SECONDS`` before ``now``: the nodes of an elastic group finish together, so a run still
    "Running" that long after is on a host that was lost with its worker, which no one is left to report. A node
    ending otherwise fails the training only when no run is left going and none completed (the others carry on)."""
    failed = [rank for rank, state in enumerate(states) if state.is_final() and not state.is_completed()]
    going = [rank for rank, state in enumerate(states) if started(state) and not state.is_final()]
    completed = [state.timestamp for state in states if state.is_completed()]
    if not elastic:
        return all(state.is_completed() for state in states), failed[0] if failed else None
    if going:
        return bool(lost_nodes(states, now)), None
    return bool(completed), None if completed or not failed else failed[0]


def lost_nodes(states: Sequence, now: datetime.datetime | None = None) -> list[int]:
    """The node runs of an elastic group still going ``ELASTIC_FINISH_GRACE_SECONDS`` after one completed: their
    host was lost with its worker (the nodes of a group finish together), so no one is left to end them."""
    completed = [state.timestamp for state in states if state.is_completed()]
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if not completed or (now - min(completed)).total_seconds() <= ELASTIC_FINISH_GRACE_SECONDS:
        return []
    return [rank for rank, state in enumerate(states) if started(state) and not state.is_final()]


# --- Prefect ------------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from prefect.client.schemas.actions import VariableCreate  # noqa: E402
from prefect.deployments import run_deployment  # noqa: E402
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402
from prefect.settings import PREFECT_API_URL  # noqa: E402
from prefect.states import Cancelled, Cancelling, Crashed  # noqa: E402
from prefect.variables import Variable  # noqa: E402


def claim_rendezvous(key: str, endpoint: str) -> tuple[str, bool]:
    """Publish ``endpoint`` as the rendezvous unless another node did first (the server creates a Variable name
    once): the endpoint to use, and whether it is this node's."""
    with get_client(sync_client=True) as client:
        try:
            client.create_variable(VariableCreate(name=key, value=endpoint))
            return endpoint, True
        except ObjectAlreadyExists:
            return client.read_variable_by_name(key).value, False


@task(name="find-rendezvous", cache_policy=NO_CACHE)
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


def cancel_unfinished(client, runs: Sequence, message: str, wait_seconds: float = CANCEL_WAIT_SECONDS) -> list:
    """Cancel every run not yet ended (one not started at once, a started one through its worker, which stops its
    processes), then wait for them to end. Returns the runs as last read."""
    for run in runs:
        state = client.read_flow_run(run.id).state
        if state is not None and not state.is_final():
            ending = Cancelled(message=message) if state.is_scheduled() else Cancelling(message=message)
            client.set_flow_run_state(run.id, ending, force=True)
    deadline = time.monotonic() + wait_seconds
    while True:
        current = [client.read_flow_run(run.id) for run in runs]
        if all(r.state is not None and r.state.is_final() for r in current):
            return current
        if time.monotonic() > deadline:
            break
        time.sleep(1.0)
    # A run still "Cancelling" has no worker left to end it (its host was lost): it would stay so for good.
    for run in current:
        if run.state is not None and not run.state.is_final():
            ended = Cancelled(message=f"{message}; no worker ended it within {wait_seconds:g} s (its host lost?)")
            client.set_flow_run_state(run.id, ended, force=True)
    return [client.read_flow_run(run.id) for run in runs]


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


def run_again(crashed, deployment: str, queue: str):
    """A crashed flow run of ``deployment`` (its host or worker lost) submitted again through ``queue`` (its cap
    holds), with the crashed run's parameters and ``replaces_run`` (a sweep's trial resumes from its checkpoint
    in the same folder: flows/sweep_trial.py), named ``<name>-rerun-N``."""
    base, _, before = crashed.name.partition("-rerun-")
    return run_deployment(
        deployment,
        parameters={**crashed.parameters, "replaces_run": str(crashed.id)},
        timeout=0,
        flow_run_name=f"{base}-rerun-{int(before or 0) + 1}",
        work_queue_name=queue,
    )


def own_work_queue(client, pool: str, name: str, limit: int | None):
    """A fan-out's own work queue in ``pool`` (a sweep's, a sharded scoring's), limited to ``limit`` runs Pending or
    Running at once (None: no limit): Prefect holds the cap (through a resumed or retried fan-out too), whatever
    is submitted. The pool's workers take runs from every queue of it."""
    try:
        return client.create_work_queue(name=name, work_pool_name=pool, concurrency_limit=limit)
    except ObjectAlreadyExists:  # resumed or retried: the same queue, its limit as now asked
        queue = client.read_work_queue_by_name(name, work_pool_name=pool)
        client.update_work_queue(queue.id, concurrency_limit=limit)
        return queue


def require_deployment(client, deployment: str, what: str):
    """The server's ``deployment`` (``flow/name``); without it one line, saying that ``what`` (e.g. "a sweep
    trains each trial") goes through it and how to deploy it."""
    try:
        return client.read_deployment_by_name(deployment)
    except ObjectNotFound:
        raise PipelineInputError(
            f"{what} through the {deployment!r} deployment, which this Prefect server does not have: deploy "
            "deployments/prefect.yaml (make deploy)"
        ) from None
