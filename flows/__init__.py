"""Prefect flows: they compose the stages in tasks/ and hold no logic of their own.

This package is also the project's public Python API, the one surface that stays where it is when modules move
(README.md, "Use it from Python"; tests/test_public_api.py):

    from flows import train_pipeline, ModelSpec, TrainingParams

Every name in ``PUBLIC`` is imported from here; anything else is internal and may move. Every type a public name
takes or gives (its parameters and return, a class's fields, methods and properties) is public too, so a caller
never imports from inside; only ImageDirectory's ``write``, ``index`` and ``samples`` and split_image_directory's
``groups`` are the stages' own. The names are imported on first use, so that ``python -m flows.<module>`` and the
torchrun worker import nothing they do not need, and importing this package changes nothing (no environment
variable: a command line's Prefect settings are set where it starts its server, flows/temporary_server.py).
"""

import importlib


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
    "monitor_pipeline": "flows.monitor",
    # what they return
    "PipelineResult": "flows.pipeline",
    "ScoreResult": "flows.score",
    "Evaluation": "tasks.evaluation.evaluate",
    "ClassReport": "tasks.evaluation.evaluate",
    "DriftReport": "tasks.monitoring.drift",
    "DriftFigure": "tasks.monitoring.drift",
    # their parameters
    "ModelSpec": "tasks.contracts.model_directory",
    "PretrainedWeights": "tasks.contracts.model_directory",
    "TrainingParams": "tasks.contracts.training_config",
    "ConversionLimits": "tasks.contracts.conversion_limits",
    "PromotionPolicy": "tasks.registry.promotion",
    "PromotionRule": "tasks.registry.promotion",
    "SearchSpace": "tasks.sweep.space",
    "LogUniform": "tasks.sweep.space",
    "Uniform": "tasks.sweep.space",
    "IntRange": "tasks.sweep.space",
    "Choice": "tasks.sweep.space",
    "SweepSettings": "tasks.sweep.study",
    # Azure's Init Image Transformation options, each an ImageTransformations field
    "ImageTransformations": "tasks.contracts.transformations",
    "Resize": "tasks.contracts.transformations",
    "CenterCrop": "tasks.contracts.transformations",
    "Pad": "tasks.contracts.transformations",
    "RandomResizedCrop": "tasks.contracts.transformations",
    "RandomCrop": "tasks.contracts.transformations",
    "RandomFlip": "tasks.contracts.transformations",
    "RandomRotation": "tasks.contracts.transformations",
    "RandomAffine": "tasks.contracts.transformations",
    "RandomPerspective": "tasks.contracts.transformations",
    "ColorJitter": "tasks.contracts.transformations",
    "RandomGrayscale": "tasks.contracts.transformations",
    "RandomErasing": "tasks.contracts.transformations",
    # the stages as plain functions, in the order a training runs them, and what they read and write
    "export_digits": "tasks.data.datasets",
    "convert_to_image_directory": "tasks.convert.conversion",
    "Normalisation": "tasks.contracts.image_manifest",
    "ImageDirectory": "tasks.contracts.image_directory",
    "ImageRecord": "tasks.contracts.image_manifest",
    "split_image_directory": "tasks.data.split",
    "SplitRecord": "tasks.contracts.image_manifest",
    "check_training_data": "tasks.data.validate",
    "LabelReport": "tasks.data.validate",
    "write_untrained_model_directory": "tasks.model.untrained",
    "launch_training": "tasks.launch.torchrun_launcher",
    "TrainingFolders": "tasks.contracts.training_config",
    "WatchLimits": "tasks.launch.torchrun_launcher",
    "ModelDirectory": "tasks.contracts.model_directory",
    "TrainingMetrics": "tasks.contracts.model_directory",
    "EpochMetrics": "tasks.contracts.model_directory",
    "score_images": "tasks.evaluation.score",
    "ScoringOptions": "tasks.evaluation.score",
    "evaluate_scores": "tasks.evaluation.evaluate",
    # the registry: register, list, resolve, alias, and its records
    "register_model": "tasks.registry.registering",
    "lineage": "tasks.registry.core",
    "list_versions": "tasks.registry.core",
    "resolve": "tasks.registry.core",
    "set_alias": "tasks.registry.core",
    "RegistryBackend": "tasks.registry.backends",
    "ModelReference": "tasks.contracts.registry_layout",
    "Registration": "tasks.contracts.registry_layout",
    "DatasetLineage": "tasks.contracts.registry_layout",
    "Promotion": "tasks.contracts.registry_layout",
    "Approval": "tasks.contracts.registry_layout",
    "AliasRecord": "tasks.contracts.registry_layout",
    # the one loaded model under predict, scoring and serving
    "LoadedModel": "tasks.inference.loaded",
    "Prediction": "tasks.inference.loaded",
    "Outputs": "tasks.inference.networks",
    "Classifier": "tasks.predict.classifier",
    # the errors a caller tells apart
    "PipelineInputError": "tasks.errors",
    "RunFailedError": "tasks.errors",
    "UnreadableImageError": "tasks.errors",
}
__all__ = sorted(PUBLIC)


def __getattr__(name: str):
    if name not in PUBLIC:
        raise AttributeError(f"module 'flows' has no attribute {name!r}")
    return getattr(importlib.import_module(PUBLIC[name]), name)
