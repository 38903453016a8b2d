"""The torchrun worker: its epoch loop on its own (one process, CPU, a tiny linear model), and what a real run
leaves (a complete ModelDirectory, a checkpoint a restart resumes from). That it loads no Prefect:
tests/test_prefect_rule.py."""

import json
import logging

import pytest
import torch
from torch import nn

from tasks.contracts.model_directory import (
    CHECKPOINT_FILE,
    METRICS_FILE,
    MODEL_FILES,
    TRAINING_LOG_FILE,
    ModelDirectory,
    driver_log_path,
)
from tasks.contracts.training_config import TrainingParams
from tasks.training import loop, worker
from tasks.training.lifeline import Heartbeat
from tests.helpers import orientation_exif, run_worker


def run_epoch(tmp_path, params: TrainingParams, batches: int = 6) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    loader = [(torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8), torch.tensor([0, 1])) for _ in range(batches)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    heartbeat = Heartbeat(tmp_path, 0)  # not started: the loop only records its progress in it
    model_input = lambda pixels: pixels.float() / 255  # noqa: E731
    ctx = loop.EpochContext(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
        params=params,
        heartbeat=heartbeat,
        world_size=1,
    )
    loop.train_one_epoch(ctx, loader, model_input, 0)


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 1/1 batch")]


def test_an_epoch_logs_every_print_frequency_batches(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=worker.logger.name):
        run_epoch(tmp_path, TrainingParams(epochs=1, print_frequency=3))
    assert [line.split(" loss")[0] for line in progress_lines(caplog)] == ["epoch 1/1 batch 3/6", "epoch 1/1 batch 6/6"]


def test_slow_batches_still_log_a_line_every_progress_interval(tmp_path, caplog, monkeypatch):
    # Every batch "slower" than the interval: each gets a line although print_frequency would give none.
    monkeypatch.setattr(loop, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger=worker.logger.name):
        run_epoch(tmp_path, TrainingParams(epochs=1, print_frequency=1000))
    assert len(progress_lines(caplog)) == 6


def test_trained_model_directory_is_complete(trained_model, colour_image_dirs):
    model_dir = ModelDirectory(trained_model)
    assert all((trained_model / name).is_file() for name in MODEL_FILES)
    assert model_dir.classes == ["blue", "green", "red"] and model_dir.spec.num_classes == 3
    assert model_dir.spec.image_size == 32  # 16 px images round up to the 32 px minimum
    metrics = model_dir.metrics()
    assert [e.epoch for e in metrics.epochs] == [1, 2] and metrics.world_size == 2
    assert metrics.best_top1 == max(e.top1 for e in metrics.epochs)
    for epoch in metrics.epochs:
        assert epoch.lr > 0 and epoch.train_images_per_s > 0 and 0 <= epoch.top1 <= epoch.top5 <= 1
    state = torch.load(model_dir.weights_path, weights_only=True)
    assert state["fc.weight"].shape == (3, 512)
    for rank in (0, 1):
        log = driver_log_path(trained_model, rank).read_text()
        assert "training resnet18 on 24 images" in log
        # 1024 MB per machine, 512 MB to each of the 2 processes: every 32 px image fits
        assert "decoded images kept in memory: 24 of 24 training, 12 of 12 validation" in log
    header = (trained_model / "training_log.csv").read_text().splitlines()[0]
    assert header == "epoch,lr,train_images_per_s,train_loss,train_error,val_loss,top1,top5,seconds"


@pytest.mark.integration
def test_a_restarted_run_resumes_from_its_checkpoint(tmp_path, colour_image_dirs, resnet_spec):
    train, val = colour_image_dirs
    args = [
        "--train",
        str(train),
        "--validation",
        str(val),
        "--model-spec",
        str(resnet_spec),
        "--output",
        str(tmp_path / "model"),
        "--batch-size",
        "8",
        "--learning-rate",
        "0.01",
    ]
    first = run_worker(*args, "--epochs", "1", processes=1)
    assert first.returncode == 0, first.stderr
    checkpoint = torch.load(tmp_path / "model" / CHECKPOINT_FILE, weights_only=True)
    assert checkpoint["epoch"] == 1 and checkpoint["config"]["params"]["epochs"] == 1
    # Stopped between its checkpoint and its log: an attempt that finds every epoch done still leaves them.
    for name in (METRICS_FILE, TRAINING_LOG_FILE):
        (tmp_path / "model" / name).unlink()
    again = run_worker(*args, "--epochs", "1", processes=1)
    assert again.returncode == 0, again.stderr
    assert [e["epoch"] for e in json.loads((tmp_path / "model" / METRICS_FILE).read_text())["epochs"]] == [1]
    assert (tmp_path / "model" / TRAINING_LOG_FILE).is_file()

    second = run_worker(*args, "--epochs", "2", processes=1)
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stdout and "after epoch 1" in second.stdout
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]


def write_stripes(root, per_class: int, sideways: bool, seed: int, ext: str = ".jpg") -> None:
    """Horizontal and vertical stripes, as displayed. ``sideways``: each stored as a phone stores a portrait photo,
    turned anticlockwise with EXIF orientation 6 (viewers turn it back), so its pixels show the other class."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label in ("horizontal", "vertical"):
        (root / label).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            period = int(rng.integers(4, 9))
            rows = (np.arange(32) + rng.integers(0, period)) // (period // 2) % 2 * 180 + 40
            pixels = np.repeat(rows[:, None], 32, axis=1) + rng.integers(-20, 20, (32, 32))
            pixels = np.clip(pixels if label == "horizontal" else pixels.T, 0, 255).astype(np.uint8)
            if sideways:
                pixels = np.rot90(pixels).copy()
            exif = orientation_exif(6 if sideways else 1)
            Image.fromarray(pixels).convert("RGB").save(root / label / f"{i}{ext}", quality=95, exif=exif)


@pytest.mark.integration
def test_a_tagged_sideways_set_trains_to_the_same_figures_as_its_upright_twin(tmp_path, resnet_spec):
    """Two real trainings (ResNet-18, one process, seeded): on PNGs stored sideways with EXIF orientation 6, and on
    their upright twins; validated on upright stripes. Conversion turns the tagged PNGs upright losslessly, so both
    train on the same pixels and every epoch's figures are the same. (JPEGs are turned within a grey level: the
    test below holds their pixels to the twin's on both decode paths.)"""
    from tasks.convert.conversion import convert_to_image_directory

    write_stripes(tmp_path / "phone", 6, sideways=True, seed=1, ext=".png")
    write_stripes(tmp_path / "twin", 6, sideways=False, seed=1, ext=".png")
    write_stripes(tmp_path / "upright", 4, sideways=False, seed=2, ext=".png")
    validation = convert_to_image_directory(tmp_path / "upright", tmp_path / "validation")
    figures = []
    for name in ("phone", "twin"):
        train = convert_to_image_directory(tmp_path / name, tmp_path / f"train-{name}")
        args = ["--train", str(train.root), "--validation", str(validation.root), "--model-spec", str(resnet_spec)]
        done = run_worker(
            *args, "--output", str(tmp_path / f"model-{name}"), "--epochs", "3", "--batch-size", "4", processes=1
        )
        assert done.returncode == 0, done.stderr[-3000:]
        epochs = ModelDirectory(tmp_path / f"model-{name}").metrics().epochs
        figures.append([(e.top1, round(e.val_loss, 4), round(e.train_loss, 4)) for e in epochs])
    assert figures[0] == figures[1]


def test_photos_stored_sideways_with_their_tag_train_as_their_upright_twins(tmp_path):
    """What the network trains on, for a set stored as a phone stores portrait photos (sideways, EXIF orientation 6)
    and for its upright twin: the same pictures, on both decode paths, so the same training. Ignoring the tag, the
    network learned the sideways pixels and scored top-1 0.0 on upright stripes (issue 38)."""
    from tasks.contracts.model_directory import IMAGENET_MEAN, IMAGENET_STD
    from tasks.contracts.transformations import ImageTransformations
    from tasks.convert.conversion import convert_to_image_directory
    from tasks.vision.device_pipeline import DevicePipeline
    from tasks.vision.images import ImageFiles
    from tasks.vision.payloads import EncodedImageFiles, collate_payloads
    from tasks.vision.transforms import eval_transform

    write_stripes(tmp_path / "phone", 6, sideways=True, seed=1)
    write_stripes(tmp_path / "twin", 6, sideways=False, seed=1)
    sets = [convert_to_image_directory(tmp_path / name, tmp_path / f"converted-{name}") for name in ("phone", "twin")]
    assert [r.orientation for r in sets[0].records()] == [6] * 12 and {r.orientation for r in sets[1].records()} == {1}
    transform = eval_transform(ImageTransformations(), 32, IMAGENET_MEAN, IMAGENET_STD)
    pipeline = DevicePipeline(transform, ImageTransformations(), 32, torch.device("cpu"))
    loader_path, device_path = [], []
    for image_dir in sets:
        files = ImageFiles(image_dir.samples(), transform, normalized=False)
        loader_path.append(torch.stack([files[i][0] for i in range(len(files))]).int())
        encoded = EncodedImageFiles(image_dir.samples(), transform)
        device_path.append(pipeline.decode(collate_payloads([encoded[i] for i in range(len(encoded))])[0]).int())
    for phone, twin in (loader_path, device_path):
        assert (phone - twin).abs().float().mean() < 2, "the twins' pixels, within the JPEG re-encoding"
        assert (phone - twin.transpose(2, 3)).abs().float().mean() > 40, "not the stored, sideways pixels"
