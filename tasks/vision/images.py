"""Image tensors from an ImageDirectory: decode, augment (uint8), normalise; the size a data set is trained at.

Shared by training, scoring and ONNX export; imports no Prefect."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torch.nn import functional as F
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


@dataclass(frozen=True)
class ImageTransform:
    """A PIL image to a normalised tensor in three stages.

    ``decode`` is deterministic (RGB, resized to ``size`` x ``size``, uint8 channels-first), so its result can be
    kept and reused; ``augment`` runs every time, still on uint8 (the random crop when training); ``normalize``
    scales to [0, 1] and normalises, on one image or a batch, on whichever device the pixels are. The training
    worker normalises on the GPU after the copy: a quarter of the bytes to pin and copy, and no float work on the
    loader's CPUs. Calling the object runs all three, like a torchvision ``Compose``.
    """

    size: int
    decode: Callable[[Image.Image], torch.Tensor]
    augment: Callable[[torch.Tensor], torch.Tensor]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        # The operations of ConvertImageDtype + Normalize, in their order: the same bits on any device.
        mean = torch.tensor(self.mean, dtype=torch.float32, device=pixels.device).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=pixels.device).view(-1, 1, 1)
        return pixels.to(torch.float32).div_(255).sub_(mean).div_(std)

    def finish(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.normalize(self.augment(pixels))

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.finish(self.decode(image))


class EdgePaddedRandomCrop:
    """torchvision's ``RandomCrop(size, padding, padding_mode="edge")`` on uint8 tensors, without building the
    whole padded image: the same offsets, drawn the same way; only the margins the window reaches are padded.

    torchvision pads the whole image in float32 and converts back: 0.40 ms of the 1.9 ms a 224 px training image
    took on one core of the H100 host (decode, resize, crop, normalise); this takes 0.13 ms."""

    def __init__(self, size: int, padding: int) -> None:
        self.size, self.padding = size, padding

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        _, height, width = pixels.shape
        top = int(torch.randint(0, height + 2 * self.padding - self.size + 1, size=(1,)).item()) - self.padding
        left = int(torch.randint(0, width + 2 * self.padding - self.size + 1, size=(1,)).item()) - self.padding
        first_row, end_row = max(0, top), min(height, top + self.size)
        first_column, end_column = max(0, left), min(width, left + self.size)
        window = pixels[:, first_row:end_row, first_column:end_column]
        margins = (first_column - left, left + self.size - end_column, first_row - top, top + self.size - end_row)
        if any(margins):
            window = F.pad(window.unsqueeze(0), margins, mode="replicate")[0]
        return window.contiguous()


def _decode(size: int) -> Callable[[Image.Image], torch.Tensor]:
    return T.Compose([T.Resize((size, size)), T.PILToTensor()])


def _unchanged(pixels: torch.Tensor) -> torch.Tensor:
    return pixels


def train_transform(size: int, mean: Sequence[float], std: Sequence[float]) -> ImageTransform:
    # No flips: they would turn some classes (digits, text, arrows) into others.
    return ImageTransform(size, _decode(size), EdgePaddedRandomCrop(size, size // 8), tuple(mean), tuple(std))


def eval_transform(size: int, mean: Sequence[float], std: Sequence[float]) -> ImageTransform:
    return ImageTransform(size, _decode(size), _unchanged, tuple(mean), tuple(std))


class ImageFiles(Dataset):
    """(image tensor, class index) for a list of (path, class index) pairs; images are decoded as RGB.

    With ``cache_bytes``, decoded and resized images are kept in memory (uint8, up to that many bytes; the
    first images in ``samples`` order when not all fit), so later epochs skip file reads, decoding and
    resizing. The cache lives in this process: it is for loading without DataLoader worker processes.
    With ``normalized=False`` images come as uint8, for ``transform.normalize`` to run on a whole batch.
    """

    def __init__(
        self,
        samples: Sequence[tuple[Path, int]],
        transform: ImageTransform,
        cache_bytes: int = 0,
        normalized: bool = True,
    ) -> None:
        self.samples = list(samples)
        self.transform = transform
        self.normalized = normalized
        side = transform.size
        capacity = min(len(self.samples), cache_bytes // (3 * side * side))
        self._cache = torch.empty((capacity, 3, side, side), dtype=torch.uint8)
        self._cached = [False] * capacity

    @property
    def cached_images(self) -> int:
        return sum(self._cached)

    @property
    def cache_capacity(self) -> int:
        return len(self._cached)

    @property
    def cache_bytes(self) -> int:
        return self._cache.nbytes

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        if index < len(self._cached) and self._cached[index]:
            pixels = self._cache[index]
        else:
            with Image.open(path) as image:
                pixels = self.transform.decode(image.convert("RGB"))
            if index < len(self._cached):
                self._cache[index] = pixels
                self._cached[index] = True
        pixels = self.transform.augment(pixels)
        return (self.transform.normalize(pixels) if self.normalized else pixels), label
