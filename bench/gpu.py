"""Accelerator figures: ResNet-50 training images/s from an ImageDirectory of JPEGs, the data-loading ceiling
alone, and GPU utilisation — through the real torchrun worker (bf16 autocast + channels_last on CUDA).

    python -m bench.gpu                         # on a CUDA host: ResNet-50 @224, batch 256, 4,096 JPEGs
    python -m bench.gpu --images 256            # a smaller run

Without CUDA it runs the same path on the CPU with a small model (ResNet-18 @64) and few images, so the
script stays tested; the accelerator figure is then reported as pending. Works with a preinstalled torch
(2.11 / torchvision 0.26 on the GPU hosts) and no package index: `PYTHONPATH=. python -m bench.gpu`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from bench.harness import Figure, table
from tasks import convert_to_image_directory
from tasks.image_directory import ImageDirectory
from tasks.model import create_model_directory
from tasks.model_directory import IMAGENET_MEAN, IMAGENET_STD, ModelSpec
from tasks.train import launch_training
from tasks.training.config import TrainingParams
from tasks.training.data import ImageFiles, train_transform

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
    """Images/s the DataLoader alone delivers (decode, crop, tensor, normalise): the most training can get."""
    dataset = ImageFiles(ImageDirectory(image_dir).samples(), train_transform(size, IMAGENET_MEAN, IMAGENET_STD))
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


def gpu_utilisation(samples: list[float], stop: threading.Event) -> None:
    while not stop.wait(0.5):
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True, text=True,
        )  # fmt: skip
        if result.returncode == 0 and result.stdout.strip():
            samples.append(float(result.stdout.split()[0]))


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

        spec = create_model_directory(scratch / "spec", ModelSpec(architecture=architecture))
        params = TrainingParams(epochs=2, batch_size=batch, image_size=size, data_workers=workers,
                                learning_rate=0.1, print_frequency=10**6)  # fmt: skip
        utilisation: list[float] = []
        stop = threading.Event()
        sampler = threading.Thread(target=gpu_utilisation, args=(utilisation, stop), daemon=True)
        if cuda:
            sampler.start()
        try:
            model_dir = launch_training(image_dir, image_dir, spec, scratch / "model", params, log=lambda level, line: None)
        finally:
            stop.set()
        training = model_dir.metrics().epochs[-1].train_images_per_s

    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({os.cpu_count()} cores), GPU figure pending"
    setting = f"{architecture} @{size}px, batch {batch}, {images} JPEGs, {workers} loader workers, {device}"
    return [
        Figure(f"training {architecture} (bf16 + channels_last on CUDA)", training, None, "images/s",
               ">= 3,200 images/s on one H100" if cuda else "pending: no GPU", H100_GOAL if cuda else None,
               notes=setting),
        Figure("data-loading ceiling (DataLoader alone)", ceiling, None, "images/s", "above training", notes=setting),
        *([Figure("GPU utilisation during training", statistics.median(utilisation), None, "%", "-",
                  notes="median of nvidia-smi samples every 0.5 s")] if utilisation else []),
    ]  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=None)
    print(table(figures(parser.parse_args().images)))
