"""Image tensors from an ImageDirectory (through an ImageTransform, tasks/vision/transforms.py); the size a data set
is trained at.

Shared by training, scoring and ONNX export; imports no Prefect."""

from __future__ import annotations

import math
import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset

from tasks.contracts.image_directory import ImageSamples
from tasks.vision.transforms import ImageTransform

DEFAULT_IMAGE_SIZE = 224
SMALLEST_IMAGE_SIZE = 32


def choose_image_size(median_side: int) -> int:
    """224 px (torchvision's size) unless the images are smaller: then their median side rounded up to 32 px.

    Upscaling 8 px digits to 224 px would cost 49x the compute for no information.
    """
    if median_side >= DEFAULT_IMAGE_SIZE:
        return DEFAULT_IMAGE_SIZE
    return max(SMALLEST_IMAGE_SIZE, math.ceil(median_side / 32) * 32)


def upright_rgb(image: Image.Image) -> Image.Image:
    """``image`` as every viewer shows it: turned by its EXIF Orientation tag (a phone stores a portrait photo
    sideways with the tag), then RGB. The CPU decode paths all open images through this."""
    ImageOps.exif_transpose(image, in_place=True)
    return image.convert("RGB")


class PathsAndLabels(Sequence[tuple[str, int]]):
    """(path, class index) pairs held as path strings and an array of indexes: a few times smaller than tuples."""

    def __init__(self, samples: Sequence[tuple[Path, int]]) -> None:
        self.paths = [os.fspath(path) for path, _ in samples]
        self.labels = array("i", (label for _, label in samples))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i):  # type: ignore[override]
        return self.paths[i], self.labels[i]


class ImageFiles(Dataset):
    """(image tensor, class index) for a list of (path, class index) pairs; images are decoded as RGB.

    With ``cache_bytes``, decoded images (the deterministic transformations done) are kept in memory (uint8, up to
    that many bytes; the first images in ``samples`` order when not all fit), so later epochs skip file reads,
    decoding and resizing. The cache lives in this process: it is for loading without DataLoader worker processes.
    With ``normalized=False`` images come as uint8, for ``transform.normalize`` to run on a whole batch.
    ``samples`` is held as given: an ImageDirectory's (``ImageDirectory.samples()``) reads its memory-mapped index
    on demand, so a process holds nothing per image and the ranks of a host share the pages (bench.scale
    measures it against ImageFolder). Any other sequence is kept as path strings and an array of class indexes.
    """

    def __init__(
        self,
        samples: Sequence[tuple[Path, int]],
        transform: ImageTransform,
        cache_bytes: int = 0,
        normalized: bool = True,
    ) -> None:
        self.samples = samples if isinstance(samples, ImageSamples) else PathsAndLabels(samples)
        self.transform = transform
        self.normalized = normalized
        side = transform.size
        capacity = min(len(samples), cache_bytes // (3 * side * side))
        self._cache = torch.empty((capacity, 3, side, side), dtype=torch.uint8)
        self._cached = [False] * capacity
        self.cache_capacity, self.cache_bytes = capacity, self._cache.nbytes  # images, and the bytes they take

    @property
    def cached_images(self) -> int:
        return sum(self._cached)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        if index < len(self._cached) and self._cached[index]:
            pixels = self._cache[index]
        else:
            with Image.open(path) as image:
                pixels = self.transform.decode(upright_rgb(image))
            if index < len(self._cached):
                self._cache[index] = pixels
                self._cached[index] = True
        pixels = self.transform.augment(pixels)
        return (self.transform.normalize(pixels) if self.normalized else pixels), label
