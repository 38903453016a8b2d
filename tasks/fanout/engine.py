"""The one fan-out engine: N child flow runs of a deployment, submitted through a work queue of the fan-out's own
with a concurrency limit, watched every few seconds, each looked at under one rule (``decisions.decide``), until
the fan-out's completion rule says it is done.

Multi-node gangs (tasks/launch/prefect_nodes.py), sweep trials (tasks/sweep/prefect_tasks.py) and score shards
(tasks/score_shards/prefect_tasks.py) open a ``FanOut`` and add only what is their own: ranks and the
rendezvous, Optuna's ask and tell, ranges and the merge. The engine

- requires the deployment (one line saying how to deploy it when the server lacks it);
- makes the fan-out's own work queue in the deployment's pool, limited to ``limit`` runs Pending or Running at
  once (None: no limit); the pool's workers take runs from every queue of it; a resumed or retried fan-out of the
  same queue name finds it again;
- submits children as subflows of the calling task's flow run, named ``<flow run>-<label>-<key>``;
- owns the loop: ``for look in fan.looks()`` yields what each look found (``Look``: every child; the ones read,
  and of those the ones changed, run again, ended), every ``poll_seconds``, until the completion rule
  (``policy``; by default every child settled) says the fan-out is done, or raises. A look reads every unsettled
  child in one ``read_flow_runs`` request filtered by their ids (``read_runs``; past the server's page, 200 runs
  unless PREFECT_SERVER_API_DEFAULT_LIMIT raises it, one more request a page) and decides each (``decide``): a
  crashed child, or one running past the rule's ``timeout_s`` (cancelled first), is run again by the engine,
  through the same queue, with the lost run's parameters and ``replaces_run`` = its id, named
  ``<name>-rerun-N``, at most ``max_reruns`` times; a child that will not run again (completed, failed,
  cancelled, re-runs spent) is settled by the engine, and its caller reads what it needs from the look;
- ends Crashed the children the completion rule names as lost (a host lost with its worker: no one else can);
- on the way out, however it ends, cancels every child not settled (through their workers, which stop their
  processes; a run no worker ends, or whose stopped process reported itself Crashed first, is set Cancelled
  through the API) and waits for them, then deletes its queue.

Callers never hold the engine's client: what they need of the server about a child goes through the engine
(``adopt``, ``cancel``, ``last_message``, ``workers``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.sorting import LogSort
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Cancelled, Cancelling, Crashed

from tasks.errors import PipelineInputError
from tasks.fanout.decisions import Decision, Outcome, RerunRule, Verdict, decide, every_child_settled

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


@dataclasses.dataclass(frozen=True)
class Look:
    """What one look at a fan-out found: ``children``, every child so far in the order submitted (settled ones as
    they ended); ``looked``, the ones read this time, each with its decision; of those, ``changed`` (its run's
    state changed, or it was run again), ``rerun`` (run again by the engine: a new flow run id) and ``ended``
    (settled by this look: completed, failed, cancelled, re-runs spent)."""

    children: tuple[Child, ...]
    looked: tuple[Child, ...]
    changed: tuple[Child, ...]
    rerun: tuple[Child, ...]
    ended: tuple[Child, ...]


class FanOut:
    """A fan-out of ``label`` children (``node``, ``trial``, ``shard``) over ``deployment``; a context manager
    (see the module's docstring). ``what`` completes the sentence "<what> through the <deployment> deployment"
    when the server lacks it. ``policy``, the completion rule, is called with the fan-out once the caller has
    handled a look: an ``Outcome`` (done or not; children to end as lost), or it raises to fail the fan-out."""

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
        policy: Callable[[FanOut], Outcome] = every_child_settled,
        poll_seconds: float = 2.0,
    ) -> None:
        self.deployment, self.label, self.what, self.queue_name = deployment, label, what, queue
        self.limit, self.rule, self.cancel_message = limit, rule, cancel_message
        self.policy, self.poll_seconds = policy, poll_seconds
        self.children: dict[int, Child] = {}
        self.log = get_run_logger().log
        self.pool: str = ""

    def __enter__(self) -> FanOut:
        self._client_context = get_client(sync_client=True)
        self._client = self._client_context.__enter__()
        try:
            self.pool = require_deployment(self._client, self.deployment, self.what).work_pool_name
            self.queue = own_work_queue(self._client, self.pool, self.queue_name, self.limit)
        except BaseException:
            self._client_context.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            unsettled = self.unsettled
            if unsettled:  # the fan-out is ending otherwise than done: no child runs on alone
                runs = cancel_unfinished(self._client, [c.flow_run_id for c in unsettled], self.cancel_message)
                forced = [r.name for r in runs if "no worker ended it" in (r.state.message or "")]
                if forced:
                    self.log(logging.WARNING, f"set Cancelled through the API, no worker having ended them: {forced}")
            with contextlib.suppress(ObjectNotFound):  # made again by a retried or resumed fan-out
                self._client.delete_work_queue_by_id(self.queue.id)
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
        return child

    def adopt(self, key: int, flow_run_id: str) -> Child | None:
        """A child submitted by an earlier attempt of the fan-out (a resumed sweep's running trial), watched again;
        None when the server no longer has its run."""
        try:
            run = self._client.read_flow_run(flow_run_id)
        except ObjectNotFound:
            return None
        child = self.children[key] = Child(key, str(run.id), run=run)
        return child

    def looks(self) -> Iterator[Look]:
        """Look at the unsettled children now and then every ``poll_seconds``, yielding what each look found,
        until the completion rule, asked once the caller has handled the look (children it submitted meanwhile
        count), says the fan-out is done; the children it names as lost are ended Crashed first."""
        while True:
            yield self.look()
            outcome = self.policy(self)
            for key, message in outcome.lost.items():
                self._end_lost(self.children[key], message)
            if outcome.done:
                return
            time.sleep(self.poll_seconds)

    def look(self) -> Look:
        """One look at every unsettled child: their runs read in one request (a page of the server's), each
        decided, run again when the rule says so, settled when it will not run again."""
        looked = self.unsettled
        runs = read_runs(self._client, [child.flow_run_id for child in looked])
        changed, rerun, ended = [], [], []
        for child in looked:
            if child.flow_run_id not in runs:
                raise RuntimeError(f"{self.label} {child.key}: flow run {child.flow_run_id} is gone from the server")
            before = (child.flow_run_id, child.state_name)
            self._decide(child, runs[child.flow_run_id])
            if before != (child.flow_run_id, child.state_name):
                changed.append(child)
            if child.decision.verdict is Verdict.RERUN:
                rerun.append(child)
            if child.decision.settled:
                child.settled = True
                ended.append(child)
        return Look(tuple(self.children.values()), tuple(looked), tuple(changed), tuple(rerun), tuple(ended))

    def _decide(self, child: Child, run) -> None:
        """``child``'s ``run`` as just read, decided: a crashed or timed-out run run again within its budget."""
        child.run = run
        running_for = (
            (datetime.datetime.now(datetime.timezone.utc) - run.start_time).total_seconds()
            if run.state is not None and run.state.is_running() and run.start_time
            else 0.0
        )
        child.decision = decide(run.state, running_for, child.reruns, self.rule)
        if child.decision.verdict in (Verdict.RUNNING, Verdict.WAITING, Verdict.COMPLETED):
            return
        child.said = last_message(self._client, run)  # read before a cancel, which makes log lines of its own
        if child.decision.timed_out:
            cancel_unfinished(
                self._client, [child.flow_run_id], f"ran past its {self.label} timeout of {self.rule.timeout_s:g} s"
            )
        if child.decision.verdict is Verdict.RERUN:
            again = run_again(run, self.deployment, self.queue_name)
            self.log(
                logging.WARNING,
                f"{self.label} {child.key}: flow run {run.name!r} {child.decision.why} ({child.said}); "
                f"run again as {again.name!r}",
            )
            child.flow_run_id, child.run, child.reruns = str(again.id), again, child.reruns + 1

    def _end_lost(self, child: Child, message: str) -> None:
        """Set ``child``'s run Crashed through the API (its host lost with its worker: no worker can, and a
        Cancelling state would wait for one); it is settled."""
        self._client.set_flow_run_state(child.flow_run_id, Crashed(message=message), force=True)
        self.log(logging.WARNING, message)
        child.settled = True

    def cancel(self, child: Child, message: str) -> None:
        """Cancel ``child``'s run (a pruned trial) and wait for it to end; it is settled."""
        cancel_unfinished(self._client, [child.flow_run_id], message)
        child.settled = True

    def last_message(self, child: Child) -> str:
        """What ``child``'s run said last (``last_message``)."""
        return last_message(self._client, child.run)

    def workers(self) -> list:
        """The workers of the fan-out's pool as the server knows them (a message naming who could take runs)."""
        return self._client.read_workers_for_work_pool(self.pool)


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


def read_runs(client, run_ids: Sequence[str]) -> dict[str, Any]:
    """The flow runs ``run_ids`` by id, in one ``read_flow_runs`` request filtered by their ids. A request returns
    at most the server's page (PREFECT_SERVER_API_DEFAULT_LIMIT: 200 runs unless raised; the server refuses a
    larger ``limit``), so the ids it did not return are asked again, one more request a page. A run the server no
    longer has is left out."""
    runs: dict[str, Any] = {}
    missing = list(dict.fromkeys(str(run_id) for run_id in run_ids))
    while missing:
        page = client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=missing)))
        runs.update((str(run.id), run) for run in page)
        if not page:
            break
        missing = [run_id for run_id in missing if run_id not in runs]
    return runs


def cancel_unfinished(client, run_ids: Iterable[str], message: str, wait_seconds: float = CANCEL_WAIT_SECONDS) -> list:
    """Cancel every run not yet ended (one not started at once, a started one through its worker, which stops its
    processes), then wait for them to end. Returns the runs as last read, in the order given.

    A started run's process, stopped by its worker, may report itself Crashed ("aborted by a termination signal")
    before its worker marks it Cancelled, seconds later: such a run is set Cancelled here, so that it ends as its
    cancellation says whichever is first."""
    run_ids = [str(run_id) for run_id in run_ids]
    stopping = set()
    for run in read_runs(client, run_ids).values():
        if run.state is not None and not run.state.is_final():
            started = not run.state.is_scheduled()
            client.set_flow_run_state(run.id, (Cancelling if started else Cancelled)(message=message), force=True)
            stopping |= {str(run.id)} if started else set()
    deadline = time.monotonic() + wait_seconds
    while True:
        current = read_runs(client, run_ids)
        if all(r.state is not None and r.state.is_final() for r in current.values()) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    for run in current.values():
        if run.state is not None and run.state.is_crashed() and str(run.id) in stopping:
            client.set_flow_run_state(run.id, Cancelled(message=f"{message} ({run.state.message})"), force=True)
        # A run still "Cancelling" has no worker left to end it (its host was lost): it would stay so for good.
        elif run.state is not None and not run.state.is_final():
            ended = Cancelled(message=f"{message}; no worker ended it within {wait_seconds:g} s (its host lost?)")
            client.set_flow_run_state(run.id, ended, force=True)
    last = read_runs(client, run_ids)
    return [last[run_id] for run_id in run_ids if run_id in last]


def last_message(client, run) -> str:
    """What ``run`` said last: its state's message (a failure's, a crash's), else its last log line (a run still
    running has no state message), else 'none'."""
    if run.state is not None and run.state.message:
        return run.state.message
    logs = client.read_logs(
        LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])), limit=1, sort=LogSort.TIMESTAMP_DESC
    )
    return logs[0].message if logs else "none"
