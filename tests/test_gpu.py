"""On a CUDA host: the pipeline end to end on the GPU (bf16 autocast, channels_last, cuDNN), ResNet-50 at 224 px
from JPEGs, GPU scoring against the CPU's ONNX export, and a clear error for more processes than GPUs.

Skipped elsewhere with the reason shown in pytest's summary (CI has no GPU). On a GPU host:

    PYTHONPATH=. python -m pytest -m gpu tests/test_gpu.py
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flows.pipeline import train_pipeline
from tasks import ImageDirectory, ModelDirectory
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import InvalidTrainingSetupError, PipelineInputError
from tasks.registry import read_registration
from tasks.score import score_images
from tasks.torchrun_launcher import launch_training

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU host"),
]


def rank_log(model_dir: str | Path, rank: int = 0) -> str:
    return (Path(model_dir) / "logs" / f"driver_log_{rank}.txt").read_text()


def test_digits_pipeline_trains_scores_and_registers_on_the_gpu(prefect_server, digits_subset, tmp_path):
    train, val = digits_subset
    result = train_pipeline(
        train_data=str(train),
        validation_data=str(val),
        model=ModelSpec(architecture="resnet18", pretrained=False),
        training=TrainingParams(epochs=4, learning_rate=0.004),
        registry=str(tmp_path / "registry"),
        work_dir=str(tmp_path / "runs"),
        export_onnx=True,
    )

    model_dir = ModelDirectory(result.location)
    assert "on cuda:0 (single process, bf16 autocast, channels_last)" in rank_log(Path(result.run_dir) / "model")
    assert result.version == 1 and "model.onnx" in read_registration(tmp_path / "registry", result.model_name, 1).files
    assert result.evaluation.images == 100 and result.evaluation.accuracy >= 0.7
    # The GPU's scores (TF32 convolutions) agree with the ONNX export run on the CPU.
    images = ImageDirectory(Path(result.run_dir) / "data" / "validation")
    on_gpu, on_cpu = score_images(model_dir, images), score_images(model_dir, images, runtime="onnx")
    columns = [c for c in on_gpu.columns if c.startswith("Scored Probabilities_")]
    worst = np.abs(on_gpu[columns].to_numpy() - on_cpu[columns].to_numpy()).max()
    print(f"GPU torch vs CPU onnxruntime: max abs probability difference {worst:.2e}")
    assert worst < 1e-2 and (on_gpu["Scored Labels"] == on_cpu["Scored Labels"]).mean() >= 0.99


def write_jpegs(root, count: int, classes: int, side: int = 256):
    """Noisy JPEGs with a colour cast per class: the path at full size (ResNet-50 from scratch on a hundred
    images learns little in two epochs, so accuracy is not asserted)."""
    rng = np.random.default_rng(count)
    for i in range(count):
        label = i % classes
        pixels = rng.integers(0, 64, (side, side, 3), dtype=np.uint8)
        pixels[..., label % 3] += 160
        (root / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / f"c{label}" / f"{i:04d}.jpg", quality=90)
    return root


def test_resnet50_at_224_from_jpegs_on_the_gpu(prefect_server, tmp_path):
    train = write_jpegs(tmp_path / "train", 96, classes=3)
    val = write_jpegs(tmp_path / "val", 30, classes=3)
    result = train_pipeline(
        train_data=str(train),
        validation_data=str(val),
        model=ModelSpec(architecture="resnet50", pretrained=False),
        training=TrainingParams(epochs=2, batch_size=32, image_size=224, learning_rate=0.01),
        registry=str(tmp_path / "registry"),
        work_dir=str(tmp_path / "runs"),
        export_onnx=True,
    )

    model_dir = ModelDirectory(result.location)
    assert model_dir.spec.architecture == "resnet50" and model_dir.spec.image_size == 224
    assert "on cuda:0 (single process, bf16 autocast, channels_last)" in rank_log(Path(result.run_dir) / "model")
    assert result.version == 1 and result.evaluation.images == 30
    assert "model.onnx" in read_registration(tmp_path / "registry", result.model_name, 1).files


def test_more_processes_than_gpus_is_an_input_error(colour_image_dirs, resnet_spec, tmp_path):
    train, val = colour_image_dirs
    params = TrainingParams(epochs=1, processes_per_node=torch.cuda.device_count() + 1, device="cuda")
    with pytest.raises(InvalidTrainingSetupError) as error:
        launch_training(
            TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
        )
    assert isinstance(error.value, PipelineInputError), "not retried"
    assert f"this host has {torch.cuda.device_count()} CUDA device(s)" in str(error.value)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs (one rank per GPU)")
def test_two_gpus_train_with_nccl(colour_image_dirs, resnet_spec, tmp_path):
    train, val = colour_image_dirs
    params = TrainingParams(epochs=1, processes_per_node=2)
    model_dir = launch_training(
        TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
    )
    assert "rank 0/2 on cuda:0 (nccl, bf16 autocast, channels_last)" in rank_log(model_dir.root)
