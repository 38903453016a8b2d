"""The Prefect side of a sweep: its trials through the fan-out engine (tasks/fanout/engine.py), each trial one flow
run of the ``sweep-trial`` deployment (flows/sweep_trial.py, pool ``gpu``: one training per host, retried like any
training), submitted ``parallel`` at a time (the sweep's own work queue's limit) as the study asks for them; a
crashed trial is run again by the engine with ``replaces_run`` and resumes from its checkpoint. Each trial's
per-epoch figure reaches the study as the trial writes it (its ``metrics.json``, local or on S3); a trial the
pruner stops is cancelled through the engine (its worker stops its processes). ``run_trials`` is one loop over
the engine's looks: each trial looked at, then new trials asked for while fewer than ``parallel`` run. A sweep
opened again (``SweepStudy`` in the same folder) re-attaches to the trials still running, settles the ones that
ended meanwhile, and abandons (re-queues) the ones whose flow run is gone. Also: each trial's training built from the study's parameters through
the model stage's and the work dir's tasks (``TrialBuilder``), the study stored after every change
(``publish_study``), and the ``sweep`` and ``sweep-pictures`` artifacts."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tasks.contracts.model_directory import ModelSpec, TrainingMetrics
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.fanout.decisions import Verdict
from tasks.fanout.engine import Child, FanOut
from tasks.launch.torchrun_output import read_metrics
from tasks.markdown.pictures import png_markdown
from tasks.model.prefect_tasks import resolve_pretrained_weights, untrained_model_directory
from tasks.storage.work_dir_on_s3 import join, local_folder
from tasks.sweep.run_folder import stored_study, trial_model
from tasks.sweep.space import SearchSpace, apply_params
from tasks.sweep.study import TRIAL_DEPLOYMENT, SweepStudy, TrialRecord, trial_folder
from tasks.work_dir.prefect_tasks import store
from tasks.work_dir.training_output import mirror_of


def trial_figure(metrics: TrainingMetrics | None, metric: str, direction: str) -> float | None:
    """A finished trial's figure: the best of its epochs' ``metric``."""
    values = [getattr(epoch, metric) for epoch in (metrics.epochs if metrics else [])]
    if not values:
        return None
    return max(values) if direction == "maximize" else min(values)


@dataclasses.dataclass
class TrialRun:
    """What the sweep keeps of a running trial beside its fan-out child: where its metrics appear, the most epochs
    it trains (past its last epoch, pruning saves nothing) and the epochs already reported to the study."""

    output_dir: str
    epochs: int
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
    until ``trials`` are settled; ``make_trial`` gives a trial's folders and parameters; ``on_change`` (the live
    ``sweep`` artifact, the study stored: a task run each) runs whenever the study changes: trials started, one run
    again or settled, not at every state its run passes through. The sweep asks for a trial when one ends (a
    sampler learns from the results) and looks at the running ones every ``poll_seconds`` (their epochs reach the
    pruner)."""
    log, settings = get_run_logger().log, study.settings
    fan = FanOut(
        deployment,
        label="trial",
        what="a sweep trains each trial",
        queue=queue,
        limit=settings.parallel,
        cancel_message="cancelled with its sweep",
        poll_seconds=poll_seconds,
    )
    with fan:
        log(
            logging.INFO, f"trials go to work queue {queue!r} of pool {fan.pool!r}: at most {settings.parallel} at once"
        )
        trials = reattach(fan, study, log)
        try:
            for look in fan.looks():
                for child in look.looked:
                    if _look(fan, study, child, trials[child.key], log):
                        on_change()
                submitted = submit_trials(fan, study, make_trial, log)
                if submitted:
                    trials.update(submitted)
                    on_change()
        finally:
            for child in fan.unsettled:  # cancelled by the engine; trained again when the sweep is retried or resumed
                study.abandon(child.key)


def reattach(fan: FanOut, study: SweepStudy, log) -> dict[int, TrialRun]:
    """A sweep opened again: its trials from before still running, watched again by ``fan``; a trial whose flow
    run the server no longer has is abandoned (re-queued)."""
    trials: dict[int, TrialRun] = {}
    for trial in study.running():
        child = fan.adopt(trial.number, trial.flow_run_id) if trial.flow_run_id else None
        if child is None:
            study.abandon(trial.number)
            continue
        folders, params = child.run.parameters["folders"], child.run.parameters["params"]
        trials[trial.number] = TrialRun(folders["output_dir"], params["epochs"], trial.epochs)
        log(logging.INFO, f"trial {trial.number}: re-attached to flow run {child.run.name!r} ({child.state_name})")
    return trials


def submit_trials(
    fan: FanOut, study: SweepStudy, make_trial: Callable[[TrialRecord], tuple[TrainingFolders, TrainingParams]], log
) -> dict[int, TrialRun]:
    """New trials, asked of the study and submitted through ``fan`` while fewer than ``parallel`` are unsettled
    and the study has more to ask; each attached to its flow run in the study."""
    submitted: dict[int, TrialRun] = {}
    while len(fan.unsettled) < study.settings.parallel and (trial := study.ask()) is not None:
        folders, params = make_trial(trial)
        parameters = {
            "folders": dataclasses.asdict(folders),
            "params": params.model_dump(mode="json"),
            "trial": trial.number,
        }
        child = fan.submit(trial.number, parameters)
        study.attach(trial.number, child.flow_run_id)
        submitted[trial.number] = TrialRun(folders.output_dir, params.epochs)
        log(logging.INFO, f"trial {trial.number}: flow run {child.run.name!r} submitted, {trial.params}")
    return submitted


def _look(fan: FanOut, study: SweepStudy, child: Child, trial: TrialRun, log) -> bool:
    """What one look found for a trial: a re-run (by the engine) attached to the study, its new epochs reported (a
    pruned trial cancelled), its end told to the study. True when the study changed (run again, pruned, ended)."""
    settings, run = study.settings, child.run
    if child.decision.verdict is Verdict.RERUN:
        study.attach(child.key, child.flow_run_id)
        return True
    metrics = trial.metrics()
    for epoch in (metrics.epochs if metrics else [])[trial.reported :]:
        trial.reported += 1
        prune = study.report(child.key, epoch.epoch, getattr(epoch, settings.metric))
        if prune and epoch.epoch < trial.epochs and not run.state.is_final():
            log(
                logging.INFO,
                f"trial {child.key}: pruned after epoch {epoch.epoch} ({settings.metric} "
                f"{getattr(epoch, settings.metric):.4g}); cancelling flow run {run.name!r}",
            )
            fan.cancel(child, f"pruned by its sweep after epoch {epoch.epoch}")
            study.tell(child.key, "pruned")
            return True
    if not child.decision.settled:
        return False
    figure = trial_figure(metrics, settings.metric, settings.objective)
    if child.decision.verdict is Verdict.COMPLETED and figure is not None:
        study.tell(child.key, "complete", figure)
        log(logging.INFO, f"trial {child.key}: {settings.metric} {figure:.4g} ({len(metrics.epochs)} epochs)")
    else:
        study.tell(child.key, "failed")
        why = child.decision.why or f"ended {run.state.name}"
        log(logging.WARNING, f"trial {child.key}: flow run {run.name!r} {why}: {child.said or 'no message'}")
    return True


@dataclasses.dataclass(frozen=True)
class TrialBuilder:
    """A trial's folders and training parameters: the base ``spec`` and ``training`` with the trial's parameters
    applied, its untrained model (checked pretrained weights staged) stored in its folder of ``run_dir``, and the
    sweep's data (converted once, stored at ``train_dir`` and ``validation_dir``) shared by every trial."""

    search_space: SearchSpace
    spec: ModelSpec
    training: TrainingParams
    run_dir: str
    train_dir: str
    validation_dir: str

    def __call__(self, trial: TrialRecord) -> tuple[TrainingFolders, TrainingParams]:
        trial_spec, params = apply_params(self.search_space, trial.params, self.spec, self.training)
        resolve_pretrained_weights(trial_spec)
        folder = trial_folder(trial.number)
        spec_dir = untrained_model_directory(str(local_folder(self.run_dir) / folder / "model_spec"), trial_spec)
        folders = TrainingFolders(
            train_dir=self.train_dir,
            validation_dir=self.validation_dir,
            model_spec_dir=store(spec_dir, join(self.run_dir, folder, "model_spec")),
            output_dir=trial_model(self.run_dir, trial.number),
        )
        return folders, params


def publish_study(study: SweepStudy, study_dir: Path, run_dir: str) -> None:
    """On S3: the study beside the run's other files, after every change; and the ``sweep`` artifact's table."""
    store(str(study_dir), stored_study(run_dir))
    publish_table(study)
