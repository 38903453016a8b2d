"""Hyperparameter sweeps: a typed search space over ModelSpec / TrainingParams fields (``space``) and the Optuna
study that asks for trials and is told their figures, kept in a journal file in the sweep's run folder so that a
sweep resumes where it stopped (``study``); the run folder's places, the study fetched on another host and the
best trial's model made ready to register (``run_folder``): none imports torch or Prefect. ``trials`` is the
Prefect part (Prefect through and through, imported at its top; no task of its own): each trial a run of the
``sweep-trial`` deployment on the pool, its epochs reported to the study, pruned ones cancelled; ``prefect_tasks``
builds each trial's training through the model stage's tasks and stores the study (both imported by the sweep
flow, not by this package)."""

from tasks.sweep.space import Choice, IntRange, LogUniform, SearchSpace, Uniform, apply_params
from tasks.sweep.study import SweepSettings, SweepStudy, TrialRecord

__all__ = [
    "Choice",
    "IntRange",
    "LogUniform",
    "SearchSpace",
    "SweepSettings",
    "SweepStudy",
    "TrialRecord",
    "Uniform",
    "apply_params",
]
