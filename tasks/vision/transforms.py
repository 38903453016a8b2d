"""The torchvision pipelines an ImageTransformations describes: decode (deterministic, cacheable), augment (random,
training only, on uint8), normalise (on the device, whole batches).

Training runs all three; inference (scoring, evaluation, the ONNX check) decode and normalise only, so the random
options are left out as Azure's "Apply Image Transformation" does for inference. Random erasing runs on uint8 like the
other random options, filling with the normalisation mean by default: once normalised that is about 0, what
torchvision's ``RandomErasing(value=0)`` writes on a normalised image (within half a grey level).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial

import torch
from PIL import Image
from torch.nn import functional as F
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as VF

from tasks.contracts.transformations import ImageTransformations
from tasks.errors import InvalidTransformationsError


@dataclass(frozen=True)
class ImageTransform:
    """A PIL image to a normalised tensor in three stages.

    ``decode`` is deterministic (RGB, the deterministic options, uint8 channels-first, ``size`` x ``size``), so its
    result can be kept and reused; ``augment`` runs every time, still on uint8 (the random options when training);
    ``normalize`` scales to [0, 1] and normalises, on one image or a batch, on whichever device the pixels are. The
    training worker normalises on the GPU after the copy: a quarter of the bytes to pin and copy, and no float work
    on the loader's CPUs. Calling the object runs all three, like a torchvision ``Compose``.
    """

    size: int
    decode: Callable[[Image.Image], torch.Tensor]
    augment: Callable[[torch.Tensor], torch.Tensor]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        # The operations of ConvertImageDtype + Normalize, in their order: the same bits on any device.
        mean, std = channel_values(tuple(self.mean), pixels.device), channel_values(tuple(self.std), pixels.device)
        return pixels.to(torch.float32).div_(255).sub_(mean).div_(std)

    def finish(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.normalize(self.augment(pixels))

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.finish(self.decode(image))


@lru_cache(maxsize=16)
def channel_values(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """Per-channel values as a (C, 1, 1) float32 tensor on ``device``, made once: made per batch, each was a copy
    from pageable host memory, which waits for all the work queued on the device (a sync every step)."""
    return torch.tensor(values, dtype=torch.float32, device=device).view(-1, 1, 1)


class EdgePaddedRandomCrop:
    """torchvision's ``v2.RandomCrop(size, padding, padding_mode="edge")`` on square uint8 tensors, without
    building the whole padded image: the same offsets, drawn the same way; only the margins the window reaches are
    padded. Off the CPU the window's rows and columns are picked by index instead, an index past the edge clamped
    to it (what edge padding repeats); ``DevicePipeline`` crops a whole batch that way with the same draws.

    torchvision pads the whole image in float32 and converts back, a good share of a training image's CPU time;
    padding only the margins costs a third of that (BENCHMARKS.md)."""

    def __init__(self, size: int, padding: int) -> None:
        self.size, self.padding = size, padding

    def _offset(self, side: int) -> int:
        room = side + 2 * self.padding - self.size
        # Like torchvision: no draw when the window fills the padded image.
        return (int(torch.randint(0, room + 1, size=()).item()) if room > 0 else 0) - self.padding

    def offsets(self, height: int, width: int) -> tuple[int, int]:
        """(top, left) of the window, relative to the unpadded image (negative: in the padding)."""
        return self._offset(height), self._offset(width)  # top drawn first, as torchvision draws them

    def window(self, offset: int, side: int) -> torch.Tensor:
        """The rows (or columns) of a window at ``offset`` on an image ``side`` long: indexes clamped to the edge."""
        return torch.arange(offset, offset + self.size).clamp_(0, side - 1)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        _, height, width = pixels.shape
        top, left = self.offsets(height, width)
        if pixels.device.type != "cpu":  # a GPU: pick the indexes (no padded copy, any dtype)
            rows, columns = self.window(top, height), self.window(left, width)
            return pixels.index_select(1, rows.to(pixels.device)).index_select(2, columns.to(pixels.device))
        # On the CPU a slice and a padded margin: several times faster than picking indexes.
        first_row, end_row = max(0, top), min(height, top + self.size)
        first_column, end_column = max(0, left), min(width, left + self.size)
        window = pixels[:, first_row:end_row, first_column:end_column]
        margins = (first_column - left, left + self.size - end_column, first_row - top, top + self.size - end_row)
        if any(margins):
            window = F.pad(window.unsqueeze(0), margins, mode="replicate")[0]
        return window.contiguous()


def _mode(name: str) -> v2.InterpolationMode:
    return v2.InterpolationMode[name.upper()]


def _unchanged(pixels: torch.Tensor) -> torch.Tensor:
    return pixels


@dataclass(frozen=True)
class Chain:
    """Callables applied in turn (a ``Compose`` without its module machinery; picklable for loader processes)."""

    steps: tuple[Callable, ...]

    def __call__(self, value):
        for step in self.steps:
            value = step(value)
        return value


def decode_steps(transformations: ImageTransformations, image_size: int) -> list[Callable]:
    """The deterministic options on the PIL image, then to uint8 channels-first.

    v2's functional kernels rather than its Transform classes: nothing here is random, and the classes' input
    flattening is a large share of a small image's decode, paid for every image that is not cached."""
    t, steps = transformations, []
    if t.resize is not None:
        side = t.resize.size or image_size
        target = [side] if t.resize.keep_aspect_ratio else [side, side]
        steps.append(partial(VF.resize, size=target, interpolation=_mode(t.resize.interpolation), antialias=True))
    if t.center_crop is not None:
        steps.append(partial(VF.center_crop, output_size=[t.center_crop.size or image_size] * 2))
    if t.pad is not None:
        steps.append(partial(VF.pad, padding=[t.pad.padding], fill=t.pad.fill, padding_mode=t.pad.padding_mode))
    if t.grayscale:
        steps.append(partial(VF.rgb_to_grayscale, num_output_channels=3))
    return [*steps, VF.pil_to_tensor]


def augment_steps(
    transformations: ImageTransformations, image_size: int, mean: Sequence[float]
) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """The random options, on uint8 tensors, in the order ImageTransformations lists them."""
    t, steps = transformations, []
    if t.random_resized_crop is not None:
        o = t.random_resized_crop
        steps.append(
            v2.RandomResizedCrop(
                o.size or image_size, o.scale, o.ratio, interpolation=_mode(o.interpolation), antialias=True
            )
        )
    if t.random_crop is not None:
        o, padding = t.random_crop, t.random_crop.padding_px(image_size)
        if o.padding_mode == "edge" and padding:
            steps.append(EdgePaddedRandomCrop(o.size or image_size, padding))  # measured faster, same draws
        else:
            steps.append(v2.RandomCrop(o.size or image_size, padding or None, fill=o.fill, padding_mode=o.padding_mode))
    if t.random_horizontal_flip is not None:
        steps.append(v2.RandomHorizontalFlip(t.random_horizontal_flip.p))
    if t.random_vertical_flip is not None:
        steps.append(v2.RandomVerticalFlip(t.random_vertical_flip.p))
    if t.random_rotation is not None:
        o = t.random_rotation
        steps.append(v2.RandomRotation(o.degrees, interpolation=_mode(o.interpolation), fill=o.fill))
    if t.random_affine is not None:
        o = t.random_affine
        steps.append(
            v2.RandomAffine(o.degrees, o.translate, o.scale, o.shear, interpolation=_mode(o.interpolation), fill=o.fill)
        )
    if t.random_perspective is not None:
        o = t.random_perspective
        steps.append(v2.RandomPerspective(o.distortion_scale, o.p, _mode(o.interpolation), fill=o.fill))
    if t.color_jitter is not None:
        o = t.color_jitter
        steps.append(v2.ColorJitter(o.brightness or None, o.contrast or None, o.saturation or None, o.hue or None))
    if t.random_grayscale is not None:
        steps.append(v2.RandomGrayscale(t.random_grayscale.p))
    if t.random_erasing is not None:
        o = t.random_erasing
        value = [round(255 * m) for m in mean] if o.value == "mean" else list(o.value)
        steps.append(v2.RandomErasing(o.p, o.scale, o.ratio, value=value))
    return steps


def steps_of(pipeline: Callable) -> tuple[Callable, ...]:
    """The steps ``_pipeline`` chained (none for the unchanged pipeline)."""
    if isinstance(pipeline, Chain):
        return pipeline.steps
    return () if pipeline is _unchanged else (pipeline,)


def _pipeline(steps: list[Callable]) -> Callable:
    if not steps:
        return _unchanged
    return steps[0] if len(steps) == 1 else Chain(tuple(steps))


def train_transform(
    transformations: ImageTransformations, size: int, mean: Sequence[float], std: Sequence[float]
) -> ImageTransform:
    """Every option: the deterministic ones in ``decode``, the random ones in ``augment``. ``size`` is the
    training image size, the side of the options whose size is left empty."""
    try:
        transformations.check_sizes(size)
    except ValueError as error:
        raise InvalidTransformationsError(str(error)) from None
    decode = Chain(tuple(decode_steps(transformations, size)))
    augment = _pipeline(augment_steps(transformations, size, mean))
    return ImageTransform(transformations.decoded_side(size), decode, augment, tuple(mean), tuple(std))


def eval_transform(
    transformations: ImageTransformations, size: int, mean: Sequence[float], std: Sequence[float]
) -> ImageTransform:
    """The deterministic options only (scoring, evaluation, the ONNX check)."""
    decode = Chain(tuple(decode_steps(transformations, size)))
    return ImageTransform(transformations.decoded_side(size), decode, _unchanged, tuple(mean), tuple(std))
