"""Hyperparameter sweeps: a typed search space over ModelSpec / TrainingParams fields (``space``) and the Optuna
study that asks for trials and is told their figures, kept in a journal file in the sweep's run folder so that a
sweep resumes where it stopped (``study``). No torch, no Prefect: the sweep flow launches each trial as a
training through the existing launch path and reports what it saw here."""

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
