"""What the loader hands the device pipeline (``tasks/vision/device_pipeline.py``): each image's payload (a JPEG's
file bytes, any other format decoded by PIL), a batch of them packed into two tensors, and batches read by threads
for scoring. Imports no Prefect."""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from tasks.contracts.image_directory import ImageSamples, orientation_of
from tasks.vision.images import PathsAndLabels, decode_image
from tasks.vision.transforms import ImageTransform

JPEG_START = b"\xff\xd8\xff"  # every JPEG file begins with a start-of-image marker and the next marker's 0xFF
# EXIF sits in an APP1 segment (at most 64 KiB) among the markers before the image data, and begins with this.
EXIF_START, EXIF_WITHIN = b"Exif\x00\x00", 2**16 + 1024


def is_jpeg(data: torch.Tensor) -> bool:
    return bytes(data[:3].tolist()) == JPEG_START


class EncodedImageFiles(Dataset):
    """(payload, class index) per image for ``DevicePipeline``: a JPEG's file bytes as a 1-D uint8 tensor, any other
    image decoded here by PIL through ``transform.decode`` (a 3-D uint8 tensor)."""

    cache_capacity = 0  # nothing is kept: the device decodes every epoch

    def __init__(self, samples: Sequence[tuple[Path, int]], transform: ImageTransform) -> None:
        self.samples = samples if isinstance(samples, ImageSamples) else PathsAndLabels(samples)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        data = torch.from_numpy(np.fromfile(path, dtype=np.uint8))
        if is_jpeg(data):
            return data, label
        return decode_on_cpu(data, self.transform), label


def decode_on_cpu(data: torch.Tensor, transform: ImageTransform) -> torch.Tensor:
    return decode_image(data.numpy().tobytes(), transform)


def exif_orientation(data: torch.Tensor) -> int:
    """The EXIF Orientation (1-8) of an encoded image's bytes (a 1-D uint8 tensor), read by PIL from the header
    only; 1 (as stored) when there is no tag or it is not one of the eight. nvJPEG ignores the tag (torchvision's
    ``apply_exif_orientation`` is for the CPU decoder only), so the device pipeline turns the pixels itself."""
    head = data[:EXIF_WITHIN].numpy().tobytes()
    if EXIF_START not in head:  # most files: no EXIF at all, and no PIL call
        return 1
    try:
        with Image.open(io.BytesIO(data.numpy().tobytes())) as image:
            return orientation_of(image)
    except (OSError, ValueError, SyntaxError):  # unreadable metadata: the decoder decides about the image
        return 1


def threaded_batches(
    dataset: Dataset, batch_size: int, collate: Callable[[list], object], threads: int, ahead: int = 4
) -> Iterator[object]:
    """``dataset``'s items in order, ``batch_size`` at a time through ``collate``, read by ``threads`` threads up to
    ``ahead`` batches ahead of the consumer: file reads and PIL release the GIL, so the reading overlaps the
    device's work. Threads, not DataLoader processes: worker processes forked inside a Prefect flow run died at
    start on the H100 host ("DataLoader worker exited unexpectedly")."""
    starts = iter(range(0, len(dataset), batch_size))  # type: ignore[arg-type]
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="read-images") as pool:
        pending: deque[list[Future]] = deque()

        def submit_next() -> None:
            start = next(starts, None)
            if start is not None:
                stop = min(start + batch_size, len(dataset))  # type: ignore[arg-type]
                pending.append([pool.submit(dataset.__getitem__, i) for i in range(start, stop)])

        for _ in range(ahead):
            submit_next()
        while pending:
            futures = pending.popleft()
            submit_next()
            yield collate([future.result() for future in futures])


class PackedPayloads(NamedTuple):
    """A batch's payloads as two tensors: what a loader process hands over and pins in one piece. Handed over as a
    list, each of a batch's payloads travelled as a shared-memory segment of its own and was pinned on its own,
    which capped loading far below what the device pipeline decodes (BENCHMARKS.md). A JPEG's EXIF orientation is
    read while packing, in the loader's processes: read in the training process, beside the step, it cost that
    process's time."""

    data: torch.Tensor  # uint8: every payload's bytes, one after another
    shapes: torch.Tensor  # int64 (N, 3): a JPEG's (bytes, 0, EXIF orientation), a decoded image's (C, H, W)

    @classmethod
    def pack(cls, payloads: Sequence[torch.Tensor]) -> PackedPayloads:
        shapes = [
            [*payload.shape, 0, exif_orientation(payload)] if payload.dim() == 1 else list(payload.shape)
            for payload in payloads
        ]
        return cls(torch.cat([payload.reshape(-1) for payload in payloads]), torch.tensor(shapes, dtype=torch.int64))

    def unpack(self) -> list[torch.Tensor]:
        """The payloads again, as views of ``data`` (pinned where it is)."""
        encoded = self.shapes[:, 1] == 0
        sizes = torch.where(encoded, self.shapes[:, 0], self.shapes.prod(dim=1))
        parts = torch.split(self.data, sizes.tolist())
        return [
            part.view(*shape) if shape[1] else part for part, shape in zip(parts, self.shapes.tolist(), strict=True)
        ]

    def orientations(self) -> list[int]:
        """Each payload's EXIF orientation (1 for a decoded image: PIL turned it already)."""
        return [orientation if height == 0 else 1 for _, height, orientation in self.shapes.tolist()]


def collate_payloads(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[PackedPayloads, torch.Tensor]:
    """A DataLoader's ``collate_fn``: the payloads packed (``PackedPayloads``), the labels one tensor."""
    packed = PackedPayloads.pack([payload for payload, _ in batch])
    return packed, torch.tensor([label for _, label in batch], dtype=torch.int64)
