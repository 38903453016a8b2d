"""One trial of a hyperparameter sweep: the ``sweep-trial`` deployment (deployments/prefect.yaml, work pool ``gpu``).

The sweep (flows/sweep.py) submits one run per trial; not meant to be run by hand.
"""

from __future__ import annotations

from prefect import flow

from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.train import train


@flow(name="sweep-trial", log_prints=True)
def sweep_trial_flow(folders: TrainingFolders, params: TrainingParams, trial: int) -> str:
    """Train one trial's model on this host through the train stage (its progress, curves and retries).

    Args:
        folders: The sweep's ImageDirectories (the same for every trial), this trial's UntrainedModelDirectory and
            the ModelDirectory it writes.
        params: This trial's training parameters (the sweep's, with the trial's values put in).
        trial: The trial's number in the sweep's study.
    """
    return train(folders, params)
