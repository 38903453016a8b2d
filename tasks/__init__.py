"""Pipeline stages: pure functions first, thin Prefect tasks at the bottom of each module.

Names are imported lazily so that ``tasks.training`` (the torchrun worker) never imports Prefect.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "convert_to_image_directory": "tasks.convert",
    "check_training_data": "tasks.data.validate",
    "split_image_directory": "tasks.data.split",
    "write_untrained_model_directory": "tasks.model",
    "build_torchrun_command": "tasks.launch.torchrun_launcher",
    "launch_training": "tasks.launch.torchrun_launcher",
    "run_training": "tasks.launch.torchrun_launcher",
    "score_images": "tasks.evaluation.score",
    "evaluate_scores": "tasks.evaluation.evaluate",
    "register_model": "tasks.registry",
    "export_digits": "tasks.data.datasets",
    "ImageDirectory": "tasks.contracts.image_directory",
    "Normalisation": "tasks.contracts.image_directory",
    "ModelDirectory": "tasks.contracts.model_directory",
    "ModelSpec": "tasks.contracts.model_directory",
    "TrainingParams": "tasks.contracts.training_config",
    "PipelineInputError": "tasks.errors",
    "NotLabeledDatasetError": "tasks.errors",
    "InvalidDatasetError": "tasks.errors",
    "ClassTooSmallToSplitError": "tasks.errors",
    "InvalidModelDirectoryError": "tasks.errors",
    "InvalidModelNameError": "tasks.errors",
    "TrainingFailedError": "tasks.errors",
    "TrainingDivergedError": "tasks.errors",
    "TrainingHungError": "tasks.errors",
    "TrainingTimeoutError": "tasks.errors",
    "OutputInUseError": "tasks.errors",
    "NodesNotJoinedError": "tasks.errors",
    "TrainingNodeFailedError": "tasks.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tasks' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
