"""A warm start (tasks/model/warm_start.py): the model stage stages a registered version's weights, checked against
its registered hashes, only when the version fits the run (its architecture, its classes in order), and a real
torchrun training begins from them, head included: after an epoch at a tiny learning rate its weights are still
the version's."""

from __future__ import annotations

import pytest
import torch

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import WARM_START_FILE, ModelDirectory, ModelSpec, read_model_spec
from tasks.errors import ModelNotFoundError, PretrainedWeightsError, WarmStartMismatchError
from tasks.model.untrained import with_pretrained_default, write_untrained_model_directory
from tasks.model.warm_start import check_warm_start, stage_warm_start
from tasks.registry import register_model, set_alias
from tasks.storage.local_files import sha256_file
from tasks.vision.weights import staged_warm_start
from tests.helpers import run_worker

NAME = "colours"


@pytest.fixture
def registry(trained_model, tmp_path) -> str:
    """The shared colours model registered as colours/1, with the production alias."""
    registry = str(tmp_path / "registry")
    register_model(registry, NAME, ModelDirectory(trained_model), metrics={"accuracy": 1.0}, params={}, datasets={})
    set_alias(registry, NAME, "production", 1)
    return registry


def test_the_version_is_staged_checked_and_recorded_only_when_it_fits_the_run(
    registry, trained_model, colour_image_dirs, tmp_path
):
    classes = ImageDirectory(colour_image_dirs[0]).classes
    output = tmp_path / "spec"
    origin = stage_warm_start(output, registry, f"{NAME}@production", "resnet18", classes)
    assert origin.name == f"{NAME}/1 ({NAME}@production)" and origin.source == registry
    assert (
        origin.sha256
        == sha256_file(output / WARM_START_FILE)
        == sha256_file(ModelDirectory(trained_model).weights_path)
    )
    spec = with_pretrained_default(ModelSpec(), own_data=True, warm_start=True)
    assert spec.pretrained is False, "a warm start needs no ImageNet weights, even for a user's own images"
    assert read_model_spec(write_untrained_model_directory(output, spec, origin)).started_from == origin

    with pytest.raises(
        WarmStartMismatchError, match=r"colours@production is a resnet18, but this run trains a resnet34"
    ):
        stage_warm_start(tmp_path / "other", registry, f"{NAME}@production", "resnet34", classes)
    with pytest.raises(WarmStartMismatchError, match=r"it lacks \['yellow'\] and the data lacks \['red'\]"):
        stage_warm_start(tmp_path / "other", registry, f"{NAME}/1", "resnet18", ["blue", "green", "yellow"])
    with pytest.raises(WarmStartMismatchError, match="in another order"):
        stage_warm_start(tmp_path / "other", registry, f"{NAME}/1", "resnet18", list(reversed(classes)))
    assert not (tmp_path / "other" / WARM_START_FILE).exists(), "nothing staged for a version that does not fit"

    check_warm_start(f"{NAME}@production", registry, pretrained=None)
    with pytest.raises(WarmStartMismatchError, match="pretrained is true and warm_start is colours/1"):
        check_warm_start(f"{NAME}/1", registry, pretrained=True)
    with pytest.raises(ModelNotFoundError, match="has no alias 'staging'"):
        check_warm_start(f"{NAME}@staging", registry, pretrained=False)

    # Without a warm start the folder holds none, even one written over an earlier warm start's.
    assert read_model_spec(write_untrained_model_directory(output, spec)).started_from is None
    assert not (output / WARM_START_FILE).exists()


def test_a_training_starts_from_the_versions_weights_head_included(registry, colour_image_dirs, tmp_path):
    train, val = colour_image_dirs
    spec_dir = tmp_path / "spec"
    origin = stage_warm_start(spec_dir, registry, f"{NAME}/1", "resnet18", ImageDirectory(train).classes)
    write_untrained_model_directory(spec_dir, ModelSpec(architecture="resnet18", pretrained=False), origin)
    (spec_dir / WARM_START_FILE).write_bytes((spec_dir / WARM_START_FILE).read_bytes() + b"\0")
    # What the worker loads (tasks/training/worker.py); a changed staged file stops torchrun's worker as an input
    # error, not retried: tests/launch/test_torchrun_launcher.py, with the ImageNet weights' staged file.
    with pytest.raises(PretrainedWeightsError, match="the staged file changed after the model stage checked it"):
        staged_warm_start(spec_dir, read_model_spec(spec_dir))

    stage_warm_start(spec_dir, registry, f"{NAME}/1", "resnet18", ImageDirectory(train).classes)
    output = tmp_path / "model"
    # A learning rate too small to learn anything in one epoch: what the model knows, it started with.
    result = run_worker(
        *("--train", str(train), "--validation", str(val), "--model-spec", str(spec_dir)),
        *("--output", str(output), "--epochs", "1", "--learning-rate", "1e-7", "--batch-size", "4"),
        processes=1,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    started, trained = (
        torch.load(path, weights_only=True) for path in (spec_dir / WARM_START_FILE, output / "model.pt")
    )
    learned = [key for key in started if "running_" not in key and "num_batches" not in key]
    assert "fc.weight" in learned and trained.keys() == started.keys()
    assert all(torch.allclose(trained[key], started[key], atol=1e-4) for key in learned), "random weights differ"
    assert f"warm start: the weights of {NAME}/1" in result.stdout
    assert read_model_spec(output).started_from == origin, "the trained version records where it began"
