"""The one fan-out engine: N child flow runs of a deployment, submitted through a work queue of the fan-out's own
with a concurrency limit, watched every few seconds, each looked at under one rule (``decisions.decide``).

Multi-node gangs (tasks/launch/prefect_nodes.py), sweep trials (tasks/sweep/prefect_tasks.py) and score shards
(tasks/score_shards/prefect_tasks.py) open a ``FanOut`` and add only what is their own: ranks and the
rendezvous, Optuna's ask and tell, ranges and the merge. The engine

- requires the deployment (one line saying how to deploy it when the server lacks it);
- makes the fan-out's own work queue in the deployment's pool, limited to ``limit`` runs Pending or Running at
  once (None: no limit); the pool's workers take runs from every queue of it; a resumed or retried fan-out of the
  same queue name finds it again;
- submits children as subflows of the calling task's flow run, named ``<flow run>-<label>-<key>``;
- on every look, reads each child's run and decides (``decide``): a crashed child, or one running past the
  rule's ``timeout_s`` (cancelled first), is run again by the engine, through the same queue, with the lost run's
  parameters and ``replaces_run`` = its id, named ``<name>-rerun-N``, at most ``max_reruns`` times; the caller
  acts on the other verdicts (completed, failed, cancelled, re-runs spent);
- calls ``on_change`` (the fan-out's live artifact) whenever a child is submitted, changes state or is re-run;
- on the way out, however it ends, cancels every child not settled (through their workers, which stop their
  processes; a run no worker ends is set Cancelled through the API) and waits for them, then deletes its queue.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.client.schemas.sorting import LogSort
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Cancelled, Cancelling

from tasks.errors import PipelineInputError
from tasks.fanout.decisions import Decision, RerunRule, Verdict, decide

# Long enough for a worker to see a cancellation and stop its flow run's processes.
CANCEL_WAIT_SECONDS = 120.0


@dataclasses.dataclass
class Child:
    """One child of a fan-out: its key (a node's rank, a trial's or a shard's number), its current flow run (the
    last re-run's), how often it was run again, and what the last look found."""

    key: int
    flow_run_id: str
    reruns: int = 0
    run: Any = None  # the flow run as last read
    decision: Decision = dataclasses.field(default_factory=lambda: Decision(Verdict.WAITING))
    said: str = ""  # the run's last message, read when it failed, crashed or timed out
    settled: bool = False

    @property
    def state_name(self) -> str:
        return self.run.state.name if self.run is not None and self.run.state is not None else "Scheduled"


class FanOut:
    """A fan-out of ``label`` children (``node``, ``trial``, ``shard``) over ``deployment``; a context manager
    (see the module's docstring). ``what`` completes the sentence "<what> through the <deployment> deployment"
    when the server lacks it."""

    def __init__(
        self,
        deployment: str,
        *,
        label: str,
        what: str,
        queue: str,
        limit: int | None = None,
        rule: RerunRule = RerunRule(),
        cancel_message: str,
        on_change: Callable[[Sequence[Child]], None] = lambda children: None,
        poll_seconds: float = 2.0,
    ) -> None:
        self.deployment, self.label, self.what, self.queue_name = deployment, label, what, queue
        self.limit, self.rule, self.cancel_message = limit, rule, cancel_message
        self.on_change, self.poll_seconds = on_change, poll_seconds
        self.children: dict[int, Child] = {}
        self.log = get_run_logger().log
        self.pool: str = ""

    def __enter__(self) -> FanOut:
        self._client_context = get_client(sync_client=True)
        self.client = self._client_context.__enter__()
        try:
            self.pool = require_deployment(self.client, self.deployment, self.what).work_pool_name
            self.queue = own_work_queue(self.client, self.pool, self.queue_name, self.limit)
        except BaseException:
            self._client_context.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            unsettled = self.unsettled
            if unsettled:  # the fan-out is ending otherwise than done: no child runs on alone
                runs = cancel_unfinished(self.client, [c.flow_run_id for c in unsettled], self.cancel_message)
                forced = [r.name for r in runs if "no worker ended it" in (r.state.message or "")]
                if forced:
                    self.log(logging.WARNING, f"set Cancelled through the API, no worker having ended them: {forced}")
            with contextlib.suppress(ObjectNotFound):  # made again by a retried or resumed fan-out
                self.client.delete_work_queue_by_id(self.queue.id)
        finally:
            self._client_context.__exit__(*exc_info)

    @property
    def unsettled(self) -> list[Child]:
        return [c for c in self.children.values() if not c.settled]

    def submit(self, key: int, parameters: dict[str, Any]) -> Child:
        """A new child run of the deployment through the fan-out's queue; not waited for."""
        run = run_deployment(
            self.deployment,
            parameters=parameters,
            timeout=0,
            flow_run_name=f"{flow_run.get_name() or self.label}-{self.label}-{key}",
            work_queue_name=self.queue_name,
        )
        child = self.children[key] = Child(key, str(run.id), run=run)
        self.on_change(list(self.children.values()))
        return child

    def adopt(self, key: int, run) -> Child:
        """A child submitted by an earlier attempt of the fan-out (a resumed sweep's running trial), watched again."""
        child = self.children[key] = Child(key, str(run.id), run=run)
        return child

    def look(self) -> list[Child]:
        """One look at every unsettled child: its run read, decided, run again when the rule says so; returns
        them. ``on_change`` is called once if any changed."""
        looked, changed = self.unsettled, False
        for child in looked:
            before = (child.flow_run_id, child.state_name)
            self._look_at(child)
            changed = changed or before != (child.flow_run_id, child.state_name)
        if changed:
            self.on_change(list(self.children.values()))
        return looked

    def _look_at(self, child: Child) -> None:
        run = child.run = self.client.read_flow_run(child.flow_run_id)
        running_for = (
            (datetime.datetime.now(datetime.timezone.utc) - run.start_time).total_seconds()
            if run.state is not None and run.state.is_running() and run.start_time
            else 0.0
        )
        child.decision = decide(run.state, running_for, child.reruns, self.rule)
        if child.decision.verdict in (Verdict.RUNNING, Verdict.WAITING, Verdict.COMPLETED):
            return
        child.said = last_message(self.client, run)  # read before a cancel, which makes log lines of its own
        if child.decision.timed_out:
            cancel_unfinished(
                self.client, [child.flow_run_id], f"ran past its {self.label} timeout of {self.rule.timeout_s:g} s"
            )
        if child.decision.verdict is Verdict.RERUN:
            again = run_again(run, self.deployment, self.queue_name)
            self.log(
                logging.WARNING,
                f"{self.label} {child.key}: flow run {run.name!r} {child.decision.why} ({child.said}); "
                f"run again as {again.name!r}",
            )
            child.flow_run_id, child.run, child.reruns = str(again.id), again, child.reruns + 1

    def settle(self, child: Child) -> None:
        """``child`` is done with (completed, failed, pruned…): no longer looked at, nor cancelled on the way out."""
        child.settled = True

    def cancel(self, child: Child, message: str) -> None:
        """Cancel ``child``'s run (a pruned trial) and wait for it to end; it is settled."""
        cancel_unfinished(self.client, [child.flow_run_id], message)
        self.settle(child)

    def watch(self, step: Callable[[list[Child]], bool]) -> None:
        """Look at the children every ``poll_seconds`` and hand ``step`` what each look found, until ``step``
        returns True (or raises)."""
        while not step(self.look()):
            time.sleep(self.poll_seconds)


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
    """A fan-out's own work queue in ``pool``, limited to ``limit`` runs Pending or Running at once (None: no
    limit): Prefect holds the cap (through a resumed or retried fan-out too), whatever is submitted."""
    try:
        return client.create_work_queue(name=name, work_pool_name=pool, concurrency_limit=limit)
    except ObjectAlreadyExists:  # resumed or retried: the same queue, its limit as now asked
        queue = client.read_work_queue_by_name(name, work_pool_name=pool)
        client.update_work_queue(queue.id, concurrency_limit=limit)
        return queue


def run_again(lost, deployment: str, queue: str):
    """A lost flow run of ``deployment`` submitted again through ``queue`` (its cap holds), with the lost run's
    parameters and ``replaces_run`` (a trial resumes from its checkpoint in the same folder: flows/sweep_trial.py),
    named ``<name>-rerun-N``."""
    base, _, before = lost.name.partition("-rerun-")
    return run_deployment(
        deployment,
        parameters={**lost.parameters, "replaces_run": str(lost.id)},
        timeout=0,
        flow_run_name=f"{base}-rerun-{int(before or 0) + 1}",
        work_queue_name=queue,
    )


def cancel_unfinished(client, run_ids: Iterable[str], message: str, wait_seconds: float = CANCEL_WAIT_SECONDS) -> list:
    """Cancel every run not yet ended (one not started at once, a started one through its worker, which stops its
    processes), then wait for them to end. Returns the runs as last read."""
    run_ids = list(run_ids)
    for run_id in run_ids:
        state = client.read_flow_run(run_id).state
        if state is not None and not state.is_final():
            ending = Cancelled(message=message) if state.is_scheduled() else Cancelling(message=message)
            client.set_flow_run_state(run_id, ending, force=True)
    deadline = time.monotonic() + wait_seconds
    while True:
        current = [client.read_flow_run(run_id) for run_id in run_ids]
        if all(r.state is not None and r.state.is_final() for r in current) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    # A run still "Cancelling" has no worker left to end it (its host was lost): it would stay so for good.
    for run in current:
        if run.state is not None and not run.state.is_final():
            ended = Cancelled(message=f"{message}; no worker ended it within {wait_seconds:g} s (its host lost?)")
            client.set_flow_run_state(run.id, ended, force=True)
    return [client.read_flow_run(run_id) for run_id in run_ids]


def last_message(client, run) -> str:
    """What ``run`` said last: its state's message (a failure's, a crash's), else its last log line (a run still
    running has no state message), else 'none'."""
    if run.state is not None and run.state.message:
        return run.state.message
    logs = client.read_logs(
        LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), limit=1, sort=LogSort.TIMESTAMP_DESC
    )
    return logs[0].message if logs else "none"
