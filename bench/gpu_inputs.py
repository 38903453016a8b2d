"""What the accelerator benchmarks train on: the setting (ResNet-50 @224, batch 256 on CUDA; ResNet-18 @64 as the
CPU's stand-in) and an ImageDirectory of random JPEGs a little larger than the images the network is given.
``bench.gpu`` and ``bench.profile_steps`` use both; ``bench.device_stages`` and ``bench.score`` make JPEGs with
``write_jpegs`` (through ``bench.gpu``, which re-exports it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from tasks.convert.conversion import convert_to_image_directory


def write_jpegs(root: Path, count: int, side: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 255, (side // 8, side // 8, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).resize((side, side), Image.Resampling.BILINEAR)
        folder = root / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:06d}.jpg", quality=90)


def setting() -> tuple[str, int, int, int]:
    """(architecture, image side, batch, loader workers): ResNet-50 @224, batch 256 on CUDA; a CPU stand-in."""
    workers = max(0, min(12, (os.cpu_count() or 1) - 2))
    return ("resnet50", 224, 256, workers) if torch.cuda.is_available() else ("resnet18", 64, 32, workers)


def bench_images(scratch: Path, images: int | None, size: int) -> Path:
    """An ImageDirectory of ``images`` JPEGs (default 4,096 on CUDA, 192 elsewhere) a little larger than ``size``."""
    write_jpegs(scratch / "jpegs", images or (4096 if torch.cuda.is_available() else 192), side=size + size // 7)
    return convert_to_image_directory(scratch / "jpegs", scratch / "images").root
