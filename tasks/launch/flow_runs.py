"""Flow runs of a deployment through the work pool, the Prefect client side that multi-node training
(``tasks.launch.prefect_tasks.run_nodes``), sweeps (``tasks.sweep.trials``) and sharded scoring
(``tasks.score_shards.prefect_tasks``) share: the deployment required, a fan-out's own work queue, a crashed run
submitted again, unfinished runs cancelled and waited for. Prefect through and through, so imported at the top;
no stage package imports this module on its own."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prefect.deployments import run_deployment
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.states import Cancelled, Cancelling

from tasks.errors import PipelineInputError

# Long enough for a worker to see a cancellation and stop its flow run's processes.
CANCEL_WAIT_SECONDS = 120.0


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
