"""A training run that replaces one whose host was lost: it takes over the lost run's folder and resumes.

When a training run's host or worker is lost, the automation "Crash runs whose host was lost (no heartbeat)" sets
it Crashed, and "Run a training again when its run crashed (host lost)" (both in deployments/automations.py) runs
its deployment again on whichever worker is free, with the lost run's parameters and ``replaces_run`` = its id; a
sweep's trial is run again by its sweep's fan-out engine (tasks/fanout/engine.py) the same way. The new run, before
anything else (``take_over_lost_run`` / ``take_over_lost_trial``, tasks/launch/prefect_tasks.py):

- follows ``replaces_run`` back through the runs it replaces to the first one, the run that began the training
  (``tasks.fanout.reruns.rerun_chain``): every run of the chain works in that run's folder,
  ``<work_dir>/<its name>-<its id's first 8>``, and registers with its id as ``training_run_id`` (the registry
  keeps one version per training);
- stops at once, with ``RerunLimitError``, once the training has been run again ``MAX_RERUNS`` times;
- says in its first log line and in artifact ``replaced-run`` which run it replaces (a link) and whether it resumes
  from the lost run's checkpoint (after which epoch) or starts over, and why (``takeover_of``, here): the folder is
  reachable when ``work_dir`` is on S3 or a folder every host shares; on the lost host's own disk it is not;
- leaves artifact ``replaced-by`` on the lost run's page, linking to itself.

This module is the plain half (no Prefect): where the training stands and what the run says about it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from tasks.contracts.model_directory import METRICS_FILE
from tasks.fanout.decisions import MAX_RERUNS, LostRun
from tasks.storage.s3 import is_s3_uri, read_s3_object
from tasks.storage.work_dir_on_s3 import join
from tasks.work_dir.training_output import epochs_in


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


def takeover_of(chain: list[LostRun], run_dir: str, model_dir: str, work_dir: str) -> Takeover:
    """Where the training in ``model_dir`` stands (``run_dir``: the folder holding it, on this host or not, under
    ``work_dir``: what the message calls it) for a run replacing the ``chain``."""
    reachable = is_s3_uri(run_dir) or Path(run_dir).is_dir()
    stored = epochs_stored(model_dir) if reachable else None
    if not reachable:
        why = (
            f"the lost run's folder {run_dir} is not on this host ({work_dir} was on the lost host's own disk; on "
            "S3 or a folder every host shares, a re-run resumes from the checkpoint)"
        )
    else:
        why = "" if stored is not None else f"the lost run had completed no epoch in {run_dir}"
    return Takeover(lost=chain, run_dir=run_dir, epochs_stored=stored, why_over=why)
