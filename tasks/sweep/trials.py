"""A sweep's trials through the work pool: each trial is one flow run of the ``sweep-trial`` deployment
(flows/sweep_trial.py, pool ``gpu``: one training per host, retried and re-run on a lost host like any training),
submitted ``parallel`` at a time as the study asks for them. Each trial's per-epoch figure reaches the study as the
trial writes it (its ``metrics.json``, local or on S3); a trial the pruner stops is cancelled through the API and
waited for (``tasks.launch.flow_runs.cancel_unfinished``: its worker stops its processes). A sweep opened again
(``SweepStudy`` in the same folder) re-attaches to the trials still running, settles the ones that ended meanwhile,
and abandons (re-queues) the ones whose flow run is gone. Prefect orchestration through and through: Prefect is
imported at the top, and the sweep package does not import this module."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run

from tasks.contracts.model_directory import TrainingMetrics
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.launch.flow_runs import cancel_unfinished, own_work_queue, require_deployment, run_again
from tasks.launch.torchrun_output import read_metrics
from tasks.sweep.study import SweepStudy, TrialRecord
from tasks.work_dir.training_output import mirror_of

TRIAL_DEPLOYMENT = "sweep-trial/sweep-trial"


def trial_figure(metrics: TrainingMetrics | None, metric: str, direction: str) -> float | None:
    """A finished trial's figure: the best of its epochs' ``metric``."""
    values = [getattr(epoch, metric) for epoch in (metrics.epochs if metrics else [])]
    if not values:
        return None
    return max(values) if direction == "maximize" else min(values)


@dataclasses.dataclass
class Watched:
    """A running trial: its flow run, where its metrics appear, and the epochs already reported."""

    number: int
    flow_run_id: str
    output_dir: str
    epochs: int  # the most it trains: past its last epoch, pruning saves nothing
    reported: int = 0

    def metrics(self) -> TrainingMetrics | None:
        mirror = mirror_of(self.output_dir)
        return mirror.remote_metrics() if mirror else read_metrics(Path(self.output_dir))


def trial_rows(records: list[TrialRecord], metric: str) -> list[dict[str, Any]]:
    """The sweep's table: a row per trial."""
    return [
        {
            "trial": r.number,
            "state": r.state,
            metric: None if r.value is None else round(r.value, 4),
            "epochs": r.epochs,
            **{name: (f"{value:.3g}" if isinstance(value, float) else value) for name, value in r.params.items()},
            "flow run": r.flow_run_id,
        }
        for r in records
    ]


def publish_table(study: SweepStudy) -> None:
    """The ``sweep`` artifact: a row per trial, and how many are settled; a new version at every change."""
    settings, records, best = study.settings, study.records(), study.best()
    settled = sum(r.state in ("complete", "pruned", "failed") for r in records)
    create_table_artifact(
        key="sweep",
        table=trial_rows(records, settings.metric),
        description=f"{settled} of {settings.trials} trials settled"
        + (f"; best so far: trial {best.number}, {settings.metric} {best.value:.4g}" if best else ""),
    )


def publish_pictures(study: SweepStudy, folder: Path, importances: dict[str, float]) -> list[Path]:
    """The ``sweep-pictures`` artifact: each parameter's importance, the optimisation history and the parallel
    coordinates of the trials; the pictures' files (in ``folder``)."""
    from tasks.evaluation.plots import png_markdown

    ranked = "".join(f"| {name} | {value:.3f} |\n" for name, value in importances.items())
    drawn = study.pictures(folder)
    pictures = "\n\n".join(png_markdown(path, path.stem.replace("_", " ")) for path in drawn)
    create_markdown_artifact(
        key="sweep-pictures",
        markdown="### Sweep\n\n"
        + (f"Parameter importance (Optuna):\n\n| parameter | importance |\n|---|---|\n{ranked}\n" if ranked else "")
        + pictures
        + "\n",
        description=f"{len(study.records())} trials: importance, optimisation history, parallel coordinates",
    )
    return drawn


def submit_trial(trial: TrialRecord, folders: TrainingFolders, params: TrainingParams, deployment: str, queue: str):
    return run_deployment(
        deployment,
        parameters={
            "folders": dataclasses.asdict(folders),
            "params": params.model_dump(mode="json"),
            "trial": trial.number,
        },
        timeout=0,
        flow_run_name=f"{flow_run.get_name() or 'sweep'}-trial-{trial.number}",
        work_queue_name=queue,
    )


def run_trials(
    study: SweepStudy,
    make_trial: Callable[[TrialRecord], tuple[TrainingFolders, TrainingParams]],
    *,
    queue: str,
    on_change: Callable[[], None] = lambda: None,
    poll_seconds: float = 2.0,
    deployment: str = TRIAL_DEPLOYMENT,
) -> None:
    """Train the study's trials through ``deployment``, ``parallel`` at a time (the work queue ``queue``'s limit),
    until ``trials`` are settled; ``make_trial`` gives a trial's folders and parameters; ``on_change`` runs whenever
    a trial starts or ends. The flow asks for a trial when one ends (a sampler learns from the results) and looks
    at the running ones every ``poll_seconds`` (their epochs reach the pruner)."""
    log = get_run_logger().log
    settings = study.settings
    watched: dict[int, Watched] = {}
    with get_client(sync_client=True) as client:
        pool = require_deployment(client, deployment, "a sweep trains each trial").work_pool_name
        work_queue = own_work_queue(client, pool, queue, settings.parallel)
        log(logging.INFO, f"trials go to work queue {queue!r} of pool {pool!r}: at most {settings.parallel} at once")
        for trial in study.running():  # a sweep opened again: its trials from before
            if trial.flow_run_id is None:
                study.abandon(trial.number)
                continue
            try:
                run = client.read_flow_run(trial.flow_run_id)
            except ObjectNotFound:
                study.abandon(trial.number)
                continue
            output_dir, epochs = run.parameters["folders"]["output_dir"], run.parameters["params"]["epochs"]
            watched[trial.number] = Watched(trial.number, trial.flow_run_id, output_dir, epochs, trial.epochs)
            log(logging.INFO, f"trial {trial.number}: re-attached to flow run {run.name!r} ({run.state.name})")
        try:
            while True:
                while len(watched) < settings.parallel and (trial := study.ask()) is not None:
                    folders, params = make_trial(trial)
                    run = submit_trial(trial, folders, params, deployment, queue)
                    study.attach(trial.number, str(run.id))
                    watched[trial.number] = Watched(trial.number, str(run.id), folders.output_dir, params.epochs)
                    log(logging.INFO, f"trial {trial.number}: flow run {run.name!r} submitted, {trial.params}")
                    on_change()
                if not watched:
                    return
                time.sleep(poll_seconds)
                for number, trial in list(watched.items()):
                    if _look(client, study, trial, log, rerun=lambda run: run_again(run, deployment, queue)):
                        del watched[number]
                        on_change()
        finally:
            if watched:  # the sweep is ending otherwise than done: no trial trains on alone
                runs = [client.read_flow_run(t.flow_run_id) for t in watched.values()]
                cancel_unfinished(client, runs, "cancelled with its sweep")
                for number in watched:  # trained again when the sweep is retried or resumed
                    study.abandon(number)
            with contextlib.suppress(ObjectNotFound):  # made again by a retried or resumed sweep
                client.delete_work_queue_by_id(work_queue.id)


def _look(client, study: SweepStudy, trial: Watched, log, rerun) -> bool:
    """One look at a running trial: its new epochs reported (and a pruned trial cancelled), a crashed run run
    again (``rerun``), its end settled. True once the trial is settled."""
    settings = study.settings
    run = client.read_flow_run(trial.flow_run_id)
    metrics = trial.metrics()
    for epoch in (metrics.epochs if metrics else [])[trial.reported :]:
        trial.reported += 1
        prune = study.report(trial.number, epoch.epoch, getattr(epoch, settings.metric))
        if prune and epoch.epoch < trial.epochs and not run.state.is_final():
            log(
                logging.INFO,
                f"trial {trial.number}: pruned after epoch {epoch.epoch} ({settings.metric} "
                f"{getattr(epoch, settings.metric):.4g}); cancelling flow run {run.name!r}",
            )
            cancel_unfinished(client, [run], f"pruned by its sweep after epoch {epoch.epoch}")
            study.tell(trial.number, "pruned")
            return True
    if not run.state.is_final():
        return False
    if run.state.is_crashed():  # its host or worker lost (the lost-host automation's Crashed, or the worker's)
        again = rerun(run)
        log(
            logging.WARNING,
            f"trial {trial.number}: flow run {run.name!r} crashed ({run.state.message or 'no message'}); "
            f"run again as {again.name!r}",
        )
        trial.flow_run_id = str(again.id)
        study.attach(trial.number, trial.flow_run_id)
        return False
    figure = trial_figure(metrics, settings.metric, settings.objective)
    if run.state.is_completed() and figure is not None:
        study.tell(trial.number, "complete", figure)
        log(logging.INFO, f"trial {trial.number}: {settings.metric} {figure:.4g} ({len(metrics.epochs)} epochs)")
    else:
        study.tell(trial.number, "failed")
        log(
            logging.WARNING,
            f"trial {trial.number}: flow run {run.name!r} ended {run.state.name}: {run.state.message or 'no message'}",
        )
    return True
