"""What the monitoring tests share: the colours model registered with its reference, built once for the run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tasks.monitoring.prefect_tasks import keep_reference
from tests.helpers import register_test_model


@pytest.fixture(scope="session")
def watched(built_once, trained_model, colour_image_dirs) -> Path:
    """A registry holding the colours model as version 1 of ``NAME``, registered with its reference."""

    def build(folder: Path) -> Path:
        model = folder / "model"
        shutil.copytree(trained_model, model)
        keep_reference.fn(str(model), str(colour_image_dirs[1]))  # what the pipeline does before registering
        register_test_model(str(folder / "registry"), model)
        return folder / "registry"

    return built_once("watched", build)
