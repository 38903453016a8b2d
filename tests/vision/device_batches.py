"""What the device pipeline and payload tests share: a pipeline on the CPU, and JPEGs or PNGs of given sizes."""

import numpy as np
import torch
from PIL import Image

from tasks.contracts.transformations import ImageTransformations
from tasks.vision.device_pipeline import DevicePipeline
from tasks.vision.transforms import eval_transform, train_transform

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CPU = torch.device("cpu")


def pipeline_for(options: dict, size: int = 32, training: bool = True) -> DevicePipeline:
    transformations = ImageTransformations(**options)
    make = train_transform if training else eval_transform
    return DevicePipeline(make(transformations, size, MEAN, STD), transformations, size, CPU)


def write_images(root, sizes: list[tuple[int, int]], suffix: str = ".jpg", mode: str = "RGB") -> list:
    rng = np.random.default_rng(len(sizes))
    paths = []
    for i, (width, height) in enumerate(sizes):
        # Smooth content, as photographs are: noise would measure the JPEG codec, not the decoders.
        small = rng.integers(0, 256, (max(2, height // 8), max(2, width // 8), 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC).convert(mode)
        paths.append(root / f"{i:03d}{suffix}")
        image.save(paths[-1], **({"quality": 92} if suffix == ".jpg" else {}))
    return paths
