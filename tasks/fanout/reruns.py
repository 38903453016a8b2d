"""Runs that replace lost ones: the chain of ``replaces_run`` back to the first run, the re-run limit, and the
links between a replacing run and the one it replaces (a log line, artifacts on both runs' pages).

A lost training run is run again by the automation (deployments/automations.py), a lost trial or shard by its
fan-out's engine (``engine.FanOut``); either way the new run carries ``replaces_run``. What a replacing training
does with the lost run's folder is the launch package's (tasks/launch/lost_runs.py, tasks/launch/prefect_tasks.py).
A sweep resumed with ``--resume`` after its own process was killed calls ``take_over_stopped_run``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactCreate
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Crashed
from prefect.utilities.urls import url_for

from tasks.errors import RerunLimitError, UnknownRunError
from tasks.fanout.decisions import MAX_RERUNS, LostRun


def lost(run) -> LostRun:
    state = run.state.name if run.state else "no state"
    if run.state and run.state.message:
        state += f": {run.state.message.rstrip('.')}"
    return LostRun(id=str(run.id), name=run.name, state=state)


def replaced_chain(replaces_run: str) -> list[LostRun]:
    """The run ``replaces_run`` and the runs it replaced in turn (their ``replaces_run`` parameters), newest first;
    read through the Prefect API, at most ``MAX_RERUNS + 1`` of them."""
    try:
        uuid.UUID(replaces_run)
    except ValueError:
        raise UnknownRunError(f"replaces_run {replaces_run!r}: not a flow run id (a UUID)") from None
    chain: list[LostRun] = []
    with get_client(sync_client=True) as client:
        next_id: str | None = replaces_run
        while next_id and len(chain) <= MAX_RERUNS and next_id not in {run.id for run in chain}:
            try:
                run = client.read_flow_run(next_id)
            except ObjectNotFound:
                raise UnknownRunError(f"replaces_run {next_id}: the Prefect server has no such flow run") from None
            chain.append(lost(run))
            next_id = (run.parameters or {}).get("replaces_run")
    return chain


def rerun_chain(replaces_run: str) -> list[LostRun]:
    """``replaced_chain``, refused with RerunLimitError once the work has been run again MAX_RERUNS times."""
    chain = replaced_chain(replaces_run)
    if len(chain) > MAX_RERUNS:
        runs = ", ".join(f"{run.name} ({run.state})" for run in chain)
        raise RerunLimitError(
            f"not run again: this training already ran {len(chain)} times and lost its host each time ({runs}); "
            f"the limit is {MAX_RERUNS} re-runs. Check the GPU hosts, then start it anew"
        )
    return chain


def announce_takeover(replaced: LostRun, headline: str, markdown: Callable[[str], str]) -> None:
    """``headline`` as this run's log line; artifact ``replaced-run`` here (``markdown`` given a link to the
    replaced run) and ``replaced-by`` on the replaced run's page, linking to this run."""
    get_run_logger().info(headline)
    create_markdown_artifact(
        key="replaced-run", markdown=markdown(link("flow-run", replaced.id, replaced.name)), description=headline
    )
    this = link("flow-run", flow_run.get_id(), flow_run.get_name())
    artifact_on(
        replaced.id,
        "replaced-by",
        f"### Run again as {this}\n\nIts host was lost; {headline}.\n",
        f"run again as {flow_run.get_name()}",
    )


def take_over_stopped_run(previous_id: str, what: str) -> str:
    """Called by a run that goes on from a stopped run's work (``what``: "sweep", resumed with ``--resume``): the
    stopped run, if the server still has it unfinished (its process was killed: nothing set it final), is set
    Crashed naming this run; one log line, artifact ``resumed-run`` here and ``resumed-by`` on the stopped run's page
    link the two. Returns the log line."""
    this_id, this_name = flow_run.get_id(), flow_run.get_name()
    with get_client(sync_client=True) as client:
        try:
            previous = client.read_flow_run(previous_id)
        except ObjectNotFound:
            line = f"Resumes the {what} of run {previous_id}, which the Prefect server no longer has"
            get_run_logger().info(line)
            return line
        if previous.state is None or not previous.state.is_final():
            message = f"Its process stopped without a final state; the {what} was resumed by run {this_name}."
            client.set_flow_run_state(previous_id, Crashed(message=message), force=True)
            previous = client.read_flow_run(previous_id)
    stopped = lost(previous)
    line = f"Resumes the {what} of run {stopped.name} ({stopped.state})"
    get_run_logger().info(line)
    create_markdown_artifact(
        key="resumed-run",
        markdown=f"### Resumes run {link('flow-run', stopped.id, stopped.name)}\n\n{line}.\n",
        description=line,
    )
    this = link("flow-run", this_id, this_name)
    artifact_on(
        stopped.id,
        "resumed-by",
        f"### Resumed by {this}\n\nThe {what} goes on in run {this}.\n",
        f"resumed by {this_name}",
    )
    return line


def link(kind: str, id: str, name: str) -> str:
    url = url_for(kind, obj_id=id)
    return f"[{name}]({url})" if url else f"{name} (`{id}`)"


def artifact_on(flow_run_id: str, key: str, markdown: str, description: str) -> None:
    """A markdown artifact on another flow run's page (the lost run's)."""
    with get_client(sync_client=True) as client:
        client.create_artifact(
            ArtifactCreate(key=key, type="markdown", data=markdown, description=description, flow_run_id=flow_run_id)
        )
