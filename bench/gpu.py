"""Accelerator figures: ResNet-50 training images/s from an ImageDirectory of JPEGs through the real torchrun
worker (bf16 autocast + channels_last on CUDA), beside its two ceilings: the data loading alone and the
device alone (training steps on one batch in device memory). Training's share of the device ceiling is the
utilisation figure: nvidia-smi read 0% on the H100 guest this was measured on, even under load.

    python -m bench.gpu                         # on a CUDA host: ResNet-50 @224, batch 256, 4,096 JPEGs
    python -m bench.gpu --images 256            # a smaller run

Without CUDA it runs the same path on the CPU with a small model (ResNet-18 @64) and few images, so the
script stays tested; the accelerator figure is then reported as pending. Works with a preinstalled torch
(2.11 / torchvision 0.26 on the GPU hosts) and no package index: `PYTHONPATH=. python -m bench.gpu`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from bench.harness import Figure, table
from tasks import convert_to_image_directory
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import IMAGENET_MEAN, IMAGENET_STD, ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.model import write_untrained_model_directory
from tasks.torchrun_launcher import launch_training
from tasks.training.loop import autocast, make_optimizer
from tasks.transformations import ImageTransformations
from tasks.vision.images import ImageFiles
from tasks.vision.networks import build_network, memory_format
from tasks.vision.transforms import train_transform

H100_GOAL = 3200.0  # the team goal for one H100 (the seed table's 16 x V100 figure)


def write_jpegs(root: Path, count: int, side: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 255, (side // 8, side // 8, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).resize((side, side), Image.Resampling.BILINEAR)
        folder = root / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:06d}.jpg", quality=90)


def loader_ceiling(image_dir: Path, size: int, batch: int, workers: int, seconds: float = 20) -> float:
    """Images/s the DataLoader alone delivers as the worker uses it (decode, resize, crop; uint8, normalised on
    the GPU): the most training can get."""
    dataset = ImageFiles(
        ImageDirectory(image_dir).samples(),
        train_transform(ImageTransformations(), size, IMAGENET_MEAN, IMAGENET_STD),
        normalized=False,
    )
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0)
    seen, start, warm = 0, None, False
    while start is None or time.perf_counter() - start < seconds:
        for images, _ in loader:
            if not warm:  # the first batch pays for starting the workers
                warm, start = True, time.perf_counter()
                continue
            seen += images.size(0)
            if time.perf_counter() - start >= seconds:
                break
    return seen / (time.perf_counter() - start)


def device_ceiling(architecture: str, size: int, batch: int, classes: int = 10, steps: int = 40) -> float:
    """Images/s of the worker's training step on one batch already on the device (its model, fused SGD, bf16
    autocast and channels_last): the most training can get from the device alone, with no loading at all."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    params = TrainingParams(batch_size=batch, image_size=size)
    model = build_network(ModelSpec(architecture=architecture), classes).to(device, memory_format=memory_format(device))
    optimizer, criterion = make_optimizer(model, 0.1, params), torch.nn.CrossEntropyLoss()
    images = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=memory_format(device))
    labels = torch.randint(0, classes, (batch,), device=device)

    def step() -> None:
        with autocast(device, params):
            loss = criterion(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(5):  # cuDNN's algorithm search and the allocator's first blocks
        step()
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return steps * batch / (time.perf_counter() - started)


def figures(images: int | None = None, ceiling_seconds: float | None = None) -> list[Figure]:
    cuda = torch.cuda.is_available()
    architecture, size, batch = ("resnet50", 224, 256) if cuda else ("resnet18", 64, 32)
    images = images or (4096 if cuda else 192)
    workers = max(0, min(12, (os.cpu_count() or 1) - 2))
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        scratch = Path(scratch)
        write_jpegs(scratch / "jpegs", images, side=size + size // 7)
        image_dir = convert_to_image_directory(scratch / "jpegs", scratch / "images").root
        ceiling = loader_ceiling(image_dir, size, batch, workers, seconds=ceiling_seconds or (20 if cuda else 5))

        spec = write_untrained_model_directory(scratch / "spec", ModelSpec(architecture=architecture))
        params = TrainingParams(
            epochs=2, batch_size=batch, image_size=size, data_workers=workers, learning_rate=0.1, print_frequency=10**6
        )
        model_dir = launch_training(
            TrainingFolders(image_dir, image_dir, spec, scratch / "model"), params, log=lambda level, line: None
        )
        training = model_dir.metrics().epochs[-1].train_images_per_s
    on_device = device_ceiling(architecture, size, batch, steps=40 if cuda else 3)

    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({os.cpu_count()} cores), GPU figure pending"
    setting = f"{architecture} @{size}px, batch {batch}, {images} JPEGs, {workers} loader workers, {device}"
    return [
        Figure(
            f"training {architecture} (bf16 + channels_last on CUDA)",
            training,
            None,
            "images/s",
            ">= 3,200 images/s on one H100" if cuda else "pending: no GPU",
            H100_GOAL if cuda else None,
            notes=setting,
        ),
        Figure("data-loading ceiling (DataLoader alone)", ceiling, None, "images/s", "above training", notes=setting),
        Figure(
            "device ceiling (training steps on one batch in device memory)",
            on_device,
            None,
            "images/s",
            "above training",
            notes=f"{setting}; training reached {training / on_device:.0%} of it",
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=None)
    print(table(figures(parser.parse_args().images)))
