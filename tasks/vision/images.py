"""Image tensors from an ImageDirectory (through an ImageTransform, tasks/vision/transforms.py); the size a data set
is trained at.

Shared by training, scoring and ONNX export; imports no Prefect."""

from __future__ import annotations

import io
import math
import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch.utils.data import Dataset

from tasks.contracts.image_directory import ImageSamples
from tasks.contracts.image_files import (
    HEIF_READER,  # noqa: F401 (registers the HEIC opener with Pillow)
    orientation_of,
)
from tasks.errors import UnreadableImageError
from tasks.vision.transforms import ImageTransform

ImageSource = bytes | bytearray | memoryview | str | os.PathLike
READABLE = "JPEG, PNG, WebP, HEIC, AVIF, …"

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


def part_of(source: ImageSource, part: str | None = None) -> str:
    """How an image is named in its errors: ``part`` when given, else its path ("image" for bare bytes)."""
    return part or ("image" if isinstance(source, bytes | bytearray | memoryview) else os.fspath(source))


def open_image(source: ImageSource, part: str | None = None, max_pixels: int | None = None) -> Image.Image:
    """``source`` (a file's path, or an encoded image's bytes) opened by Pillow, its header read and nothing
    decoded yet: refused (``UnreadableImageError`` naming ``part``, by default the path) when it is missing, empty,
    not an image, or has more than ``max_pixels`` pixels (413: a decompression bomb is never decoded)."""
    encoded, part = isinstance(source, bytes | bytearray | memoryview), part_of(source, part)
    if encoded and not len(source):
        raise UnreadableImageError(part, "empty: no image bytes")
    try:
        image = Image.open(io.BytesIO(source) if encoded else source)
    except FileNotFoundError:
        raise UnreadableImageError(part, "no such file") from None
    except Image.DecompressionBombError as error:  # past twice Pillow's own limit: refused by Image.open
        raise UnreadableImageError(part, f"refused as a decompression bomb ({error})", 413) from None
    except UnidentifiedImageError:
        raise UnreadableImageError(part, f"not an image Pillow can read ({READABLE})") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise UnreadableImageError(part, f"damaged or truncated image ({error})") from None
    if max_pixels is not None and image.width * image.height > max_pixels:
        image.close()
        raise UnreadableImageError(
            part,
            f"{image.width} x {image.height} = {image.width * image.height:,} pixels, more than the {max_pixels:,} "
            "allowed (--max-image-pixels)",
            413,
        )
    return image


def image_properties(source: ImageSource) -> dict[str, int | str]:
    """width, height, mode and EXIF orientation (1-8) of an image, from its header: nothing decoded."""
    with open_image(source) as image:
        return {"width": image.width, "height": image.height, "mode": image.mode, "orientation": orientation_of(image)}


def decode_image(
    source: ImageSource, transform: ImageTransform, part: str | None = None, max_pixels: int | None = None
) -> torch.Tensor:
    """The one decode of every path that reads an image on the CPU (training, scoring, predict, the endpoint): the
    uint8 (3, side, side) tensor after ``transform``'s deterministic steps, EXIF orientation applied, RGB. A file or
    bytes that cannot be decoded raise ``UnreadableImageError`` (``open_image``), truncation and damage included."""
    with open_image(source, part, max_pixels) as image:
        try:
            return transform.decode(upright_rgb(image))
        except (OSError, SyntaxError, ValueError) as error:
            raise UnreadableImageError(part_of(source, part), f"damaged or truncated image ({error})") from None


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
            pixels = decode_image(path, self.transform)
            if index < len(self._cached):
                self._cache[index] = pixels
                self._cached[index] = True
        pixels = self.transform.augment(pixels)
        return (self.transform.normalize(pixels) if self.normalized else pixels), label
