"""The sweep's Optuna study, asked for trials and told their figures (ask-and-tell): Optuna samples (random or
TPE, seeded) and prunes (median, or successive halving: ASHA); nothing here searches or prunes by hand.

The study lives in Optuna's journal file in the sweep's folder (``STUDY_FILE``): an append-only log that a sweep
opened again reads back whole, so a sweep stopped part way keeps its finished trials and sees the ones that were
running. A running trial that cannot be re-attached is abandoned (failed, marked so) and its parameters queued
again: ``trials`` counts every trial but the abandoned ones, so a trial is never counted twice across attempts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tasks.sweep.space import SearchSpace

STUDY_FILE = "study.journal"
TRIAL_DEPLOYMENT = "sweep-trial/sweep-trial"  # a trial is a run of it (tasks/sweep/prefect_tasks.py)
STUDY_NAME = "sweep"
_ABANDONED = "abandoned"  # a trial's user attribute: it was re-run as another trial (not counted)
_ATTEMPTS = "sweep_flow_runs"  # the study's user attribute: the sweep's flow runs that drove it, in order
_FLOW_RUN = "flow_run_id"  # a trial's user attribute: the flow run that trains it
# The figures each epoch reports (tasks.contracts.model_directory.EpochMetrics), and which way is better.
METRICS = {"top1": "maximize", "top5": "maximize", "val_loss": "minimize"}


def trial_folder(number: int) -> str:
    """Trial ``number``'s folder in the sweep's run folder: its ``model_spec/`` and ``model/`` go below it."""
    return f"trials/trial-{number:03d}"


class SweepSettings(BaseModel):
    """How many trials, how many at once, how they are sampled and pruned, and what they are judged by."""

    model_config = ConfigDict(extra="forbid")
    trials: int = Field(8, gt=0, description="trials in all, across a resumed sweep's attempts")
    parallel: int = Field(2, gt=0, description="trials training at once (one per host of the gpu pool)")
    sampler: Literal["random", "tpe"] = Field("tpe", description="random search, or Optuna's TPE")
    seed: int = Field(1, description="the sampler's seed")
    pruner: Literal["none", "median", "asha"] = Field(
        "asha", description="stop poor trials early: median stopping, or asynchronous successive halving"
    )
    prune_after: int = Field(
        2,
        ge=1,
        description="epochs every trial trains before the pruner may stop it (ASHA's first rung, the median "
        "pruner's warm-up): on data learned in an epoch or two, the first epoch's figure says little",
    )
    metric: Literal["top1", "top5", "val_loss"] = Field(
        "top1", description="the validation figure a trial is judged by"
    )
    direction: Literal["maximize", "minimize"] | None = Field(None, description="empty: the metric's own")

    @model_validator(mode="after")
    def _parallel_within_trials(self) -> SweepSettings:
        if self.parallel > self.trials:
            raise ValueError(f"parallel {self.parallel} is more than trials {self.trials}: give parallel ≤ trials")
        return self

    @property
    def objective(self) -> Literal["maximize", "minimize"]:
        return self.direction or METRICS[self.metric]  # type: ignore[return-value]


class TrialRecord(BaseModel):
    """A row of the sweep's table."""

    number: int
    state: Literal["waiting", "running", "complete", "pruned", "failed", "abandoned"]
    params: dict[str, Any]
    value: float | None = None
    epochs: int = Field(0, description="epochs that reported a figure")
    flow_run_id: str | None = None


def _sampler(settings: SweepSettings, asked: int = 0):
    """The sampler for a sweep whose study holds ``asked`` trials. A sweep opened again draws from a stream of its
    own (the seed and ``asked``): with the seed alone it would draw its first trials' parameters again."""
    import numpy as np
    import optuna

    seed = settings.seed if not asked else int(np.random.SeedSequence([settings.seed, asked]).generate_state(1)[0])
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(settings: SweepSettings):
    import optuna

    if settings.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=settings.parallel, n_warmup_steps=settings.prune_after)
    if settings.pruner == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=settings.prune_after)
    return optuna.pruners.NopPruner()


class SweepStudy:
    """The study in ``folder / STUDY_FILE``, created or opened again."""

    def __init__(self, folder: Path, settings: SweepSettings, space: SearchSpace) -> None:
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        folder.mkdir(parents=True, exist_ok=True)
        self.settings, self.space = settings, space
        self.storage = JournalStorage(JournalFileBackend(str(folder / STUDY_FILE)))
        self.study = optuna.create_study(
            study_name=STUDY_NAME,
            storage=self.storage,
            sampler=_sampler(settings),
            pruner=_pruner(settings),
            direction=settings.objective,
            load_if_exists=True,
        )
        if asked := len(self.study.get_trials(deepcopy=False)):
            self.study.sampler = _sampler(settings, asked)
        self.distributions = space.distributions()

    def begin_attempt(self, flow_run_id: str) -> str | None:
        """Records ``flow_run_id`` as the flow run driving the study now; returns the one that drove it before
        (a resumed sweep's stopped run), or None for a new study or the same run again (a retry)."""
        attempts = list(self.study.user_attrs.get(_ATTEMPTS, []))
        previous = attempts[-1] if attempts else None
        if previous == flow_run_id:
            return None
        self.study.set_user_attr(_ATTEMPTS, [*attempts, flow_run_id])
        return previous

    def _trial(self, number: int):
        import optuna

        study_id = self.storage.get_study_id_from_name(STUDY_NAME)
        return optuna.trial.Trial(self.study, self.storage.get_trial_id_from_study_id_trial_number(study_id, number))

    def counted(self) -> int:
        """Trials that count toward ``trials``: every one asked for but the abandoned."""
        return sum(1 for t in self.study.get_trials(deepcopy=False) if not t.user_attrs.get(_ABANDONED))

    def ask(self) -> TrialRecord | None:
        """A new trial and its parameters (queued ones first), or None once ``trials`` are counted."""
        from optuna.trial import TrialState

        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if self.counted() - len(waiting) >= self.settings.trials:
            return None
        trial = self.study.ask(self.distributions)
        return self.record(trial.number)

    def attach(self, number: int, flow_run_id: str) -> None:
        """Record the flow run that trains trial ``number``."""
        self._trial(number).set_user_attr(_FLOW_RUN, flow_run_id)

    def report(self, number: int, epoch: int, value: float) -> bool:
        """Trial ``number``'s figure after ``epoch`` (reported once per epoch); whether the pruner stops it."""
        trial = self._trial(number)
        if epoch not in self.study.trials[number].intermediate_values:
            trial.report(value, step=epoch)
        return trial.should_prune()

    def tell(self, number: int, outcome: Literal["complete", "pruned", "failed"], value: float | None = None) -> None:
        from optuna.trial import TrialState

        state = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED, "failed": TrialState.FAIL}[outcome]
        self.study.tell(number, value if outcome == "complete" else None, state=state)

    def abandon(self, number: int) -> None:
        """Trial ``number`` will not finish (its flow run is gone): failed, marked abandoned (not counted), and its
        parameters queued for the next ``ask``."""
        from optuna.trial import TrialState

        params = self.study.trials[number].params
        self._trial(number).set_user_attr(_ABANDONED, True)
        self.study.tell(number, state=TrialState.FAIL)
        self.study.enqueue_trial(params, skip_if_exists=False)

    def running(self) -> list[TrialRecord]:
        return [r for r in self.records() if r.state == "running"]

    def record(self, number: int) -> TrialRecord:
        trial = self.study.trials[number]
        state = "abandoned" if trial.user_attrs.get(_ABANDONED) else trial.state.name.lower()
        state = {"fail": "failed"}.get(state, state)
        value = trial.value if trial.value is not None else None
        return TrialRecord(
            number=trial.number,
            state=state,
            params=trial.params,
            value=value,
            epochs=len(trial.intermediate_values),
            flow_run_id=trial.user_attrs.get(_FLOW_RUN),
        )

    def records(self) -> list[TrialRecord]:
        return [self.record(t.number) for t in self.study.get_trials(deepcopy=False)]

    def importances(self) -> dict[str, float]:
        """Each searched parameter's importance to the figure (Optuna's default evaluator, over the completed
        trials); empty while fewer than two completed or the parameters did not vary."""
        import optuna
        from optuna.trial import TrialState

        if len(self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))) < 2:
            return {}
        try:
            return {name: float(value) for name, value in optuna.importance.get_param_importances(self.study).items()}
        except (RuntimeError, ValueError):  # e.g. every completed trial had the same values
            return {}

    def pictures(self, folder: Path) -> list[Path]:
        """The optimisation history and the parallel-coordinate plot of the completed trials, as PNGs in
        ``folder`` (Optuna's matplotlib plots); none while no trial completed."""
        import warnings

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as plots

        if self.best() is None:
            return []
        folder.mkdir(parents=True, exist_ok=True)
        drawn = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
            for name, plot in (
                ("optimisation_history", plots.plot_optimization_history),
                ("parallel_coordinate", plots.plot_parallel_coordinate),
            ):
                axes = plot(self.study)
                figure = (axes[0] if hasattr(axes, "__len__") else axes).get_figure()
                figure.set_size_inches(8, 4.5)
                figure.tight_layout()
                path = folder / f"{name}.png"
                figure.savefig(path, dpi=100)
                plt.close(figure)
                drawn.append(path)
        return drawn

    def best(self) -> TrialRecord | None:
        from optuna.trial import TrialState

        if not self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            return None
        return self.record(self.study.best_trial.number)
