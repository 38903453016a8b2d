"""Your own photos to a fine-tuned model, end to end: one folder of photos is split, a MobileNet v3 starts from
pretrained weights fetched from a mirror (HTTP on loopback) and hash-checked, trains with a flip through a real
torchrun, exports to ONNX and is registered; the model card records the split, the transformations and the weights.

The weights are a state dict of our own (real ImageNet files cannot be fetched here) with its real sha256."""

import asyncio
import hashlib
import io
from pathlib import Path

import pytest
import torch
import torchvision

from flows.pipeline import train_pipeline
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory, ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.contracts.transformations import ImageTransformations, RandomFlip
from tasks.registry import read_registration
from tests.helpers import artifacts_and_task_runs, write_class_folders

pytestmark = pytest.mark.integration


def test_one_folder_of_photos_becomes_a_fine_tuned_registered_model(prefect_server, server, torch_home, tmp_path):
    photos = write_class_folders(tmp_path / "photos", per_class=8)  # red/green/blue, 8 photos each
    buffer = io.BytesIO()
    torch.manual_seed(0)
    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), buffer)
    weights, sha256 = buffer.getvalue(), hashlib.sha256(buffer.getvalue()).hexdigest()
    server.files["/models/mobilenet-v3-small-photos.pth"] = weights

    result = train_pipeline(
        train_data=str(photos),
        validation_fraction=0.25,
        model=ModelSpec(
            architecture="mobilenet_v3_small",
            weights_path=f"{server.url}/models/mobilenet-v3-small-photos.pth",
            weights_sha256=sha256,
            transformations=ImageTransformations(random_horizontal_flip=RandomFlip()),
        ),  # pretrained left empty: your own photos start from the pretrained weights
        training=TrainingParams(epochs=1, batch_size=4),
        registry=str(tmp_path / "registry"),
        work_dir=str(tmp_path / "runs"),
        export_onnx=True,
    )

    assert result.model_name == "photos-mobilenet_v3_small" and result.version == 1
    registration = read_registration(tmp_path / "registry", result.model_name, 1)
    # The split: 6 of each class's 8 photos train, 2 validate, and each side's manifest says where it came from.
    assert registration.datasets["train"].images == 18 and registration.datasets["validation"].images == 6
    validation = ImageDirectory(Path(result.run_dir) / "data" / "validation")
    assert validation.manifest.split.side == "second" and validation.manifest.split.fraction == pytest.approx(0.75)
    assert registration.datasets["validation"].split == validation.manifest.split
    # The weights were fetched once, checked, and recorded by name and hash; the model was trained from them.
    assert server.requests == ["/models/mobilenet-v3-small-photos.pth"]
    trained = ModelDirectory(result.location)
    assert trained.spec.pretrained and trained.spec.weights.sha256 == sha256
    assert registration.params["pretrained_weights"]["sha256"] == sha256
    assert trained.spec.transformations.random_horizontal_flip == RandomFlip()
    assert "model.onnx" in registration.files

    artifacts, _ = asyncio.run(artifacts_and_task_runs(registration.flow_run_id))
    card = next(a for a in artifacts if a.key == "model-card-photos-mobilenet-v3-small").data
    assert sha256[:12] in card and "horizontal flip" in card
    assert "75% of" in card and "split with seed 1" in card
