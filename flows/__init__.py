"""Prefect flows: they compose the stages in tasks/ and hold no logic of their own.

This package is also the project's public Python API, the one surface that stays where it is when modules move
(README.md, "Use it from Python"; tests/test_public_api.py):

    from flows import train_pipeline, ModelSpec, TrainingParams

Every name in ``PUBLIC`` is imported from here; anything else is internal and may move. The names are imported on
first use, so that ``python -m flows.<module>`` and the torchrun worker import nothing they do not need.
"""

import importlib
import os

# Every entry point (python -m flows.pipeline / flows.score, the deployments) imports this package first: no usage
# reports from the Prefect server it may start, unless the user said otherwise.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The temporary server a command starts without PREFECT_API_URL: Prefect waits 20 s for it, far less than its start
# can take on a loaded small machine (BENCHMARKS.md). A start that still fails is one line (flows.cli.run_command).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def run_folder(work_dir: str, prefix: str = "") -> str:
    """This flow run's folder under ``work_dir`` (a path or s3://bucket/prefix), named after the run: a retried
    run finds its files again. A local one gets its ``run.json`` first (what ``runs prune`` recognises)."""
    from prefect.runtime import flow_run

    from tasks.storage.runs import mark_run, run_folder_location

    folder = run_folder_location(work_dir, f"{prefix}{flow_run.get_name()}-{flow_run.get_id()[:8]}")
    mark_run(folder, prefix.rstrip("-") or "train", flow_run.get_id())
    return folder


# name -> the module that defines it today
PUBLIC = {
    # the flows
    "train_pipeline": "flows.pipeline",
    "score_pipeline": "flows.score",
    "compare_models": "flows.score",
    "sweep_pipeline": "flows.sweep",
    # their parameters
    "ModelSpec": "tasks.contracts.model_directory",
    "TrainingParams": "tasks.contracts.training_config",
    "ImageTransformations": "tasks.contracts.transformations",
    "ConversionLimits": "tasks.contracts.conversion_limits",
    "PromotionPolicy": "tasks.registry.promotion",
    # the stages as plain functions, and what they read and write
    "convert_to_image_directory": "tasks.convert.conversion",
    "check_training_data": "tasks.data.validate",
    "export_digits": "tasks.data.datasets",
    "launch_training": "tasks.launch.torchrun_launcher",
    "score_images": "tasks.evaluation.score",
    "ImageDirectory": "tasks.contracts.image_directory",
    "ModelDirectory": "tasks.contracts.model_directory",
    "Classifier": "tasks.predict.classifier",
    # the errors a caller tells apart
    "PipelineInputError": "tasks.errors",
    "RunFailedError": "tasks.errors",
}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name not in PUBLIC:
        raise AttributeError(f"module 'flows' has no attribute {name!r}")
    return getattr(importlib.import_module(PUBLIC[name]), name)
