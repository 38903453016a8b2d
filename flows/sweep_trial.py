"""One trial of a hyperparameter sweep: the ``sweep-trial`` deployment (deployments/prefect.yaml, work pool ``gpu``).

The sweep (flows/sweep.py) submits one run per trial, and runs a trial again, with ``replaces_run``, when its run
crashed (its host or worker lost); not meant to be run by hand.
"""

from __future__ import annotations

from prefect import flow

from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.launch.prefect_tasks import take_over_lost_trial, train


@flow(name="sweep-trial", log_prints=True)
def sweep_trial_flow(
    folders: TrainingFolders, params: TrainingParams, trial: int, replaces_run: str | None = None
) -> str:
    """Train one trial's model on this host through the train stage (its progress, curves and retries).

    Args:
        folders: The sweep's ImageDirectories (the same for every trial), this trial's UntrainedModelDirectory and
            the ModelDirectory it writes.
        params: This trial's training parameters (the sweep's, with the trial's values put in).
        trial: The trial's number in the sweep's study.
        replaces_run: Set by the sweep when it runs a crashed trial again: the lost run's id; this run resumes from its checkpoint in the same folder where that folder is reachable.
    """
    if replaces_run:
        take_over_lost_trial(replaces_run, folders.output_dir)
    return train(folders, params)
