"""A training run that replaces one whose host was lost: it takes over the lost run's folder and resumes.

When a training run's host or worker is lost, the automation "Crash runs whose host was lost (no heartbeat)" sets
it Crashed, and "Run a training again when its run crashed (host lost)" (both in deployments/automations.py) runs
its deployment again on whichever worker is free, with the lost run's parameters and ``replaces_run`` = its id.
The new run, before anything else (``take_over_lost_run``):

- follows ``replaces_run`` back through the runs it replaces to the first one, the run that began the training:
  every run of the chain works in that run's folder, ``<work_dir>/<its name>-<its id's first 8>``, and registers
  with its id as ``training_run_id`` (the registry keeps one version per training);
- stops at once, with ``RerunLimitError``, once the training has been run again ``MAX_RERUNS`` times;
- says in its first log line and in artifact ``replaced-run`` which run it replaces (a link) and whether it resumes
  from the lost run's checkpoint (after which epoch) or starts over, and why: the folder is reachable when
  ``work_dir`` is on S3 or a folder every host shares; on the lost host's own disk it is not;
- leaves artifact ``replaced-by`` on the lost run's page, linking to itself.

A sweep's trial (flows/sweep_trial.py) is run again by its sweep instead (tasks/sweep/trials.py), into the same
folder, and takes over with ``take_over_lost_trial``: the same limit, first line and artifacts.

A sweep resumed with ``--resume`` after its own process was killed calls ``take_over_stopped_run``: the stopped
attempt's run, left Running, is set Crashed naming the new run, and the two link to each other.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from pydantic import BaseModel

from tasks.contracts.model_directory import METRICS_FILE
from tasks.errors import RerunLimitError, UnknownRunError
from tasks.storage.runs import mark_run, run_folder_location
from tasks.storage.s3 import is_s3_uri, read_s3_object
from tasks.storage.work_dir_on_s3 import join
from tasks.work_dir.training_output import epochs_in

MAX_RERUNS = 2  # a training is run at most 1 + MAX_RERUNS times when its hosts keep being lost


class LostRun(BaseModel):
    id: str
    name: str
    state: str  # the state's name and message: "Crashed: No heartbeat for 180 s: ..."


class Takeover(BaseModel):
    """What a run that replaces a lost one found: the chain of runs it continues and where the training stands."""

    lost: list[LostRun]  # the run it replaces first, then the runs that one replaced, back to the training's first
    run_dir: str  # the first run's folder, where this run works
    # Complete epochs the folder's metrics.json records; None: none, it starts over. Its checkpoint holds at least
    # these: metrics.json is stored after the checkpoint it announces, so a host lost between the two left the
    # checkpoint ahead (the training log's "resuming from … after epoch N" says where it resumed).
    epochs_stored: int | None
    why_over: str = ""  # with epochs_stored None: why it starts over

    @property
    def replaced(self) -> LostRun:
        return self.lost[0]

    @property
    def training_run_id(self) -> str:
        return self.lost[-1].id

    def headline(self) -> str:
        """The run's first log line."""
        again = f"re-run {len(self.lost)} of at most {MAX_RERUNS}"
        where = (
            f"resuming from its last checkpoint (epoch {self.epochs_stored} or later) in {self.run_dir}"
            if self.epochs_stored is not None
            else f"starting over: {self.why_over}"
        )
        return f"Replaces run {self.replaced.name} ({self.replaced.state}); {again}; {where}"

    def markdown(self, link: str) -> str:
        rows = "\n".join(f"| {run.name} | `{run.id}` | {run.state} |" for run in self.lost)
        return (
            f"### Replaces run {link}\n\n{self.headline()}.\n\n| run replaced | id | state |\n|---|---|---|\n{rows}\n"
        )


def epochs_stored(model_location: str) -> int | None:
    """Complete epochs in the training output at ``model_location`` (a path or s3:// URI): its metrics.json,
    written after each epoch's checkpoint; None when there is none."""
    if is_s3_uri(model_location):
        data = read_s3_object(join(model_location, METRICS_FILE))
    else:
        path = Path(model_location) / METRICS_FILE
        data = path.read_bytes() if path.is_file() else None
    epochs = epochs_in(data)  # -1 when there is none
    return epochs if epochs > 0 else None


def _lost(run) -> LostRun:
    state = run.state.name if run.state else "no state"
    if run.state and run.state.message:
        state += f": {run.state.message.rstrip('.')}"
    return LostRun(id=str(run.id), name=run.name, state=state)


def replaced_chain(replaces_run: str) -> list[LostRun]:
    """The run ``replaces_run`` and the runs it replaced in turn (their ``replaces_run`` parameters), newest first;
    read through the Prefect API, at most ``MAX_RERUNS + 1`` of them."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

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
            chain.append(_lost(run))
            next_id = (run.parameters or {}).get("replaces_run")
    return chain


def take_over_lost_run(replaces_run: str, work_dir: str) -> Takeover:
    """Called first by a training run whose ``replaces_run`` is set (see the module's docstring): its Takeover of
    the first run's folder under ``work_dir``, told in the first log line, artifact ``replaced-run`` here and
    ``replaced-by`` on the lost run."""
    chain = rerun_chain(replaces_run)
    first = chain[-1]
    run_dir = run_folder_location(work_dir, f"{first.name}-{first.id[:8]}")
    takeover = _take_over(chain, run_dir, join(run_dir, "model"), f"work_dir {work_dir!r}")
    mark_run(run_dir, "train", first.id)
    return takeover


def take_over_lost_trial(replaces_run: str, output_dir: str) -> Takeover:
    """The same for a sweep's trial run again by its sweep (tasks/sweep/trials.py): it trains into the lost run's
    ``output_dir``, in the trial's folder of the sweep's run folder, and resumes from its checkpoint there."""
    chain = rerun_chain(replaces_run)
    parent = output_dir.rstrip("/").rsplit("/", 1)[0]
    return _take_over(chain, parent, output_dir, "the sweep's work_dir")


def rerun_chain(replaces_run: str) -> list[LostRun]:
    """``replaced_chain``, refused with RerunLimitError once the training has been run again MAX_RERUNS times."""
    chain = replaced_chain(replaces_run)
    if len(chain) > MAX_RERUNS:
        runs = ", ".join(f"{run.name} ({run.state})" for run in chain)
        raise RerunLimitError(
            f"not run again: this training already ran {len(chain)} times and lost its host each time ({runs}); "
            f"the limit is {MAX_RERUNS} re-runs. Check the GPU hosts, then start it anew"
        )
    return chain


def _take_over(chain: list[LostRun], run_dir: str, model_dir: str, work_dir: str) -> Takeover:
    """Where the training in ``model_dir`` stands (``run_dir``: the folder holding it, on this host or not, under
    ``work_dir``: what the message calls it), told in the first log line and the two artifacts."""
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact
    from prefect.runtime import flow_run

    reachable = is_s3_uri(run_dir) or Path(run_dir).is_dir()
    stored = epochs_stored(model_dir) if reachable else None
    if not reachable:
        why = (
            f"the lost run's folder {run_dir} is not on this host ({work_dir} was on the lost host's own disk; on "
            "S3 or a folder every host shares, a re-run resumes from the checkpoint)"
        )
    else:
        why = "" if stored is not None else f"the lost run had completed no epoch in {run_dir}"
    takeover = Takeover(lost=chain, run_dir=run_dir, epochs_stored=stored, why_over=why)
    get_run_logger().info(takeover.headline())
    create_markdown_artifact(
        key="replaced-run",
        markdown=takeover.markdown(_link("flow-run", takeover.replaced.id, takeover.replaced.name)),
        description=takeover.headline(),
    )
    this = _link("flow-run", flow_run.get_id(), flow_run.get_name())
    _artifact_on(
        takeover.replaced.id,
        "replaced-by",
        f"### Run again as {this}\n\nIts host was lost; {takeover.headline()}.\n",
        f"run again as {flow_run.get_name()}",
    )
    return takeover


def take_over_stopped_run(previous_id: str, what: str) -> str:
    """Called by a run that goes on from a stopped run's work (``what``: "sweep", resumed with ``--resume``): the
    stopped run, if the server still has it unfinished (its process was killed: nothing set it final), is set
    Crashed naming this run; one log line, artifact ``resumed-run`` here and ``resumed-by`` on the stopped run's page
    link the two. Returns the log line."""
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.runtime import flow_run
    from prefect.states import Crashed

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
    stopped = _lost(previous)
    line = f"Resumes the {what} of run {stopped.name} ({stopped.state})"
    get_run_logger().info(line)
    create_markdown_artifact(
        key="resumed-run",
        markdown=f"### Resumes run {_link('flow-run', stopped.id, stopped.name)}\n\n{line}.\n",
        description=line,
    )
    this = _link("flow-run", this_id, this_name)
    _artifact_on(
        stopped.id,
        "resumed-by",
        f"### Resumed by {this}\n\nThe {what} goes on in run {this}.\n",
        f"resumed by {this_name}",
    )
    return line


def _link(kind: str, id: str, name: str) -> str:
    from prefect.utilities.urls import url_for

    url = url_for(kind, obj_id=id)
    return f"[{name}]({url})" if url else f"{name} (`{id}`)"


def _artifact_on(flow_run_id: str, key: str, markdown: str, description: str) -> None:
    """A markdown artifact on another flow run's page (the lost run's)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    with get_client(sync_client=True) as client:
        client.create_artifact(
            ArtifactCreate(key=key, type="markdown", data=markdown, description=description, flow_run_id=flow_run_id)
        )
