"""Datasets and transforms over an ImageDirectory (shared by training and scoring)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T

DEFAULT_IMAGE_SIZE = 224
SMALLEST_IMAGE_SIZE = 32


def choose_image_size(median_side: int) -> int:
    """224 px (torchvision's size) unless the images are smaller: then their median side rounded up to 32 px.

    Upscaling 8 px digits to 224 px would cost 49x the compute for no information.
    """
    if median_side >= DEFAULT_IMAGE_SIZE:
        return DEFAULT_IMAGE_SIZE
    return max(SMALLEST_IMAGE_SIZE, math.ceil(median_side / 32) * 32)


def train_transform(size: int, mean: Sequence[float], std: Sequence[float]) -> Callable:
    # No flips: they would turn some classes (digits, text, arrows) into others.
    return T.Compose(
        [
            T.Resize((size, size)),
            T.RandomCrop(size, padding=size // 8, padding_mode="edge"),
            T.ToTensor(),
            T.Normalize(mean, std),
        ]
    )


def eval_transform(size: int, mean: Sequence[float], std: Sequence[float]) -> Callable:
    return T.Compose([T.Resize((size, size)), T.ToTensor(), T.Normalize(mean, std)])


class ImageFiles(Dataset):
    """(image tensor, class index) for a list of (path, class index) pairs; images are decoded as RGB."""

    def __init__(self, samples: Sequence[tuple[Path, int]], transform: Callable) -> None:
        self.samples = list(samples)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), label
