"""DenseNet / ResNet: write an UntrainedModelDirectory for the training stage (Azure's model modules)."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.model_directory import ModelSpec, write_model_spec


def write_untrained_model_directory(output: str | os.PathLike[str], spec: ModelSpec) -> Path:
    """Write ``spec`` to ``output/model_spec.json``, after checking that pretrained weights exist and fit.

    Checking here, not in the worker, fails a bad weights file before any training job is launched.
    """
    if spec.pretrained:
        from tasks.vision.networks import build_network

        build_network(spec, num_classes=2)
    return write_model_spec(output, spec)


# --- Prefect task -------------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402


@task(name="untrained-model", cache_policy=NO_CACHE)
def untrained_model_directory(output: str, spec: ModelSpec) -> str:
    """Artifact ``model-spec``."""
    root = write_untrained_model_directory(output, spec)
    described = {**spec.model_dump(), "transformations": spec.transformations.describe()}
    options = "\n".join(f"| {k} | {v} |" for k, v in described.items())
    create_markdown_artifact(
        key="model-spec",
        markdown=f"### Untrained model\n\n| option | value |\n|---|---|\n{options}\n",
        description=f"{spec.architecture}, " + ("pretrained weights" if spec.pretrained else "trained from scratch"),
    )
    return str(root)
