"""Multi-node training through the work pool: one flow run of the ``train-node`` deployment per node.

With ``nodes > 1`` (or ``min:max``) the train task (tasks/launch/prefect_nodes.py) submits one run of the node deployment
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

This module is the plain half (no Prefect): the rendezvous, the node runs' parameters, the gang's completion rule
(``GangRule``: when the nodes are done or failed, which runs were lost with their host), the messages. The Prefect
half (the rendezvous Variable, ``find_rendezvous``, ``run_nodes``) is in ``tasks/launch/prefect_nodes.py``; the
node runs are submitted, watched, ended when lost and cancelled by the fan-out engine (tasks/fanout/engine.py),
under the rule handed to it.
"""

from __future__ import annotations

import dataclasses
import datetime
import socket
import time
import uuid
from collections.abc import Sequence
from urllib.parse import urlsplit

from pydantic import BaseModel

from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import NodesNotJoinedError, TrainingNodeFailedError
from tasks.fanout.decisions import Outcome

NODE_DEPLOYMENT = "train-node/train-node"
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


def lost_node_message(rank: int, state) -> str:
    return (
        f"node {rank}: still {state.name} {ELASTIC_FINISH_GRACE_SECONDS:g} s after another node of its group "
        "completed: its host was lost with its worker; ended by the train stage"
    )


@dataclasses.dataclass
class GangRule:
    """The gang's completion rule, handed to the fan-out engine (its ``policy``), asked after each look with the
    fan-out (its ``children`` by rank, its ``pool`` and ``workers()``): done by ``nodes_outcome``, the elastic
    group's lost runs (``lost_nodes``) named for the engine to end Crashed; a node whose end fails the training
    raises TrainingNodeFailedError, and fewer than the nodes needed started once ``join_timeout_s`` has passed since
    the first look raises NodesNotJoinedError."""

    params: TrainingParams
    joined_by: float | None = None  # time.monotonic() by which the nodes needed must have started

    def __call__(self, fan) -> Outcome:
        runs = [child.run for child in fan.children.values()]
        states = [run.state for run in runs]
        now = datetime.datetime.now(datetime.timezone.utc)
        elastic = self.params.min_nodes < self.params.max_nodes
        done, failed = nodes_outcome(states, elastic, now)
        if failed is not None:
            message = node_failed_message(failed, runs[failed].name, states[failed])
            raise TrainingNodeFailedError(message, returncode=None, rank=None, log_tail=states[failed].message or "")
        if done:
            lost = lost_nodes(states, now) if elastic else []
            return Outcome(done=True, lost={rank: lost_node_message(rank, states[rank]) for rank in lost})
        if self.joined_by is None:
            self.joined_by = time.monotonic() + self.params.join_timeout_s
        if time.monotonic() >= self.joined_by and sum(started(state) for state in states) < self.params.min_nodes:
            workers = fan.workers()
            raise NodesNotJoinedError(
                not_joined_message(states, self.params.min_nodes, fan.pool, workers, self.params.join_timeout_s, now)
            )
        return Outcome(done=False)
