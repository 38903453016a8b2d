"""Images decoded and transformed a whole batch at a time on the device that trains or scores (``decode_on``).

The loader only reads files (``tasks/vision/payloads.py``): a JPEG travels as its encoded bytes (a 1-D uint8
tensor, far smaller than its pixels), any other format is decoded on the CPU as before. On the device,
``DevicePipeline``:

1. decodes the batch's JPEGs in one call (``torchvision.io.decode_jpeg`` on a list: nvJPEG's batched decoder on
   CUDA, libjpeg-turbo on the CPU); a JPEG it cannot decode there is decoded by PIL, like any other format; each
   image is then turned upright by its EXIF orientation (read from the header by the loader, while packing the
   batch), as PIL's ``exif_transpose`` turns it on the CPU path;
2. runs the deterministic options (resize, centre crop, pad, grayscale) as tensor operations, on all images of
   one shape at once;
3. runs the random options as batched tensor operations where it knows them (the edge-padded random crop and the
   flips: one gather for the whole batch), each image's numbers drawn in the order the per-image CPU path draws
   them, so for the same decoded pixels and seed the result is the same to the bit
   (tests/vision/test_device_pipeline.py); other random options run image by image on the device;
4. normalises the batch there.

In training, ``DecodedAhead`` runs step 1 and 2 in a thread a batch or two before the step needs them.

Decoding differs from the CPU path's PIL by a grey level or two on average (nvJPEG's inverse DCT and chroma
upsampling, torch's antialiased resize for PIL's), less than the JPEG's own compression error: tests/test_gpu.py
measures it. Imports no Prefect.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from queue import Empty, Queue

import torch
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import v2

from tasks.contracts.transformations import ImageTransformations
from tasks.vision.payloads import PackedPayloads, decode_on_cpu, exif_orientation
from tasks.vision.transforms import EdgePaddedRandomCrop, ImageTransform, decode_steps, steps_of

logger = logging.getLogger(__name__)

BATCHED_STEPS = (EdgePaddedRandomCrop, v2.RandomHorizontalFlip, v2.RandomVerticalFlip)


def turned_upright(pixels: torch.Tensor, orientation: int) -> torch.Tensor:
    """A decoded (C, H, W) image as displayed, for its EXIF ``orientation`` (1-8): the flip or turn PIL's
    ``ImageOps.exif_transpose`` makes for each value (tests/vision/test_device_pipeline.py compares all eight)."""
    if orientation in (5, 6, 7, 8):  # stored with its sides swapped
        # 5 transpose; 6 turned clockwise (PIL's ROTATE_270); 7 transverse; 8 turned anticlockwise (ROTATE_90).
        turn = {5: 0, 6: -1, 7: 2, 8: 1}[orientation]
        pixels = pixels.transpose(-1, -2) if orientation in (5, 7) else pixels
        return pixels.rot90(turn, dims=(-2, -1)) if turn else pixels
    flips = {1: (), 2: (-1,), 3: (-2, -1), 4: (-2,)}.get(orientation, ())
    return pixels.flip(flips) if flips else pixels


class DevicePipeline:
    """Payloads (``EncodedImageFiles``) to a normalised float batch on ``device``.

    ``transform`` is the CPU pipeline of the same options (``train_transform`` or ``eval_transform``): its
    ``decode`` for formats other than JPEG, its random steps and its normalisation are the ones used here."""

    def __init__(
        self, transform: ImageTransform, transformations: ImageTransformations, image_size: int, device: torch.device
    ) -> None:
        self.transform, self.device = transform, torch.device(device)
        self.decode_steps = decode_steps(transformations, image_size)[:-1]  # all but PIL-to-tensor: they take tensors
        self.random_steps = steps_of(transform.augment)
        self.batched = all(isinstance(step, BATCHED_STEPS) for step in self.random_steps)
        self._stream: torch.cuda.Stream | None = None  # nvJPEG's own, made on first use

    def decode(self, payloads: PackedPayloads | Sequence[torch.Tensor]) -> torch.Tensor:
        """The uint8 batch (N, 3, side, side) on the device after the deterministic options, in payload order."""
        if isinstance(payloads, PackedPayloads):
            orientations, payloads = payloads.orientations(), payloads.unpack()
        else:
            orientations = [exif_orientation(payload) if payload.dim() == 1 else 1 for payload in payloads]
        images: list[torch.Tensor | None] = [None] * len(payloads)
        encoded = []
        for i, payload in enumerate(payloads):
            if payload.dim() == 1:
                encoded.append(i)
            else:  # decoded by the loader (not a JPEG): the deterministic options are done
                images[i] = payload.to(self.device, non_blocking=True)
        decoded = self._decode_jpegs([payloads[i] for i in encoded])
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, pixels in zip(encoded, decoded, strict=True):
            if pixels.dim() == 1:  # the decoder refused it (nvJPEG a CMYK JPEG, for one): PIL, as on the CPU path
                images[i] = decode_on_cpu(pixels.cpu(), self.transform).to(self.device)
            else:
                images[i] = pixels = turned_upright(pixels, orientations[i])
                by_shape.setdefault(tuple(pixels.shape), []).append(i)
        for indexes in by_shape.values():  # one call per shape for the resize and the other deterministic options
            batch = torch.stack([images[i] for i in indexes])
            for step in self.decode_steps:
                batch = step(batch)
            for i, pixels in zip(indexes, batch, strict=True):
                images[i] = pixels
        return torch.stack(images)  # type: ignore[arg-type]

    def _decode_jpegs(self, payloads: list[torch.Tensor]) -> list[torch.Tensor]:
        """Decoded RGB images, or the payload itself for one the decoder refused."""
        if not payloads:
            return []
        if self.device.type != "cuda":
            return self._decode_here(payloads, "cpu")
        # nvJPEG's hardware decoder writes its outputs without waiting for the work queued on its stream, and the
        # caching allocator hands out a block freed on a stream while that stream's queued kernels may still read
        # it: decoding on the training stream corrupted the network's memory (NaN losses within an epoch on the
        # H200; pytorch/vision#9606). So decoding runs on a stream of its own with nothing queued on it, and the
        # caller's stream keeps each image's block until its own work on it is done.
        caller = torch.cuda.current_stream(self.device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._stream):
            self._stream.synchronize()
            images = self._decode_here(payloads, self.device)
        caller.wait_stream(self._stream)
        for image in images:
            if image.is_cuda:  # not the payloads nvJPEG refused (CMYK, for one): PIL decodes those on the CPU
                image.record_stream(caller)
        return images

    @staticmethod
    def _decode_here(payloads: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
        try:
            return list(decode_jpeg(payloads, mode=ImageReadMode.RGB, device=device))
        except RuntimeError as error:  # one bad image fails the whole batched call: find it, decode the rest
            logger.debug("batched JPEG decoding failed (%s): decoding one by one", error)
        images = []
        for payload in payloads:
            try:
                images.append(decode_jpeg(payload, mode=ImageReadMode.RGB, device=device))
            except RuntimeError:
                images.append(payload)
        return images

    def augment(self, batch: torch.Tensor) -> torch.Tensor:
        """The random options on a uint8 batch: one gather for crops and flips, else image by image."""
        if not self.random_steps:
            return batch
        if not self.batched:
            return torch.stack([self.transform.augment(pixels) for pixels in batch])
        count, _, height, width = batch.shape
        rows, columns = [], []
        for _ in range(count):  # per image, in the steps' order: the draws of the per-image CPU path
            row, column = torch.arange(height), torch.arange(width)  # which source row, column lands where
            for step in self.random_steps:
                if isinstance(step, EdgePaddedRandomCrop):
                    top, left = step.offsets(len(row), len(column))
                    row, column = row[step.window(top, len(row))], column[step.window(left, len(column))]
                elif torch.rand(1) < step.p:  # v2's flips: `if torch.rand(1) >= p: return unchanged`
                    if isinstance(step, v2.RandomHorizontalFlip):
                        column = column.flip(0)
                    else:
                        row = row.flip(0)
            rows.append(row)
            columns.append(column)
        rows_, columns_ = self._to_device(torch.stack(rows)), self._to_device(torch.stack(columns))
        images = torch.arange(count, device=self.device)[:, None, None]
        # (N, side, side, 3) from advanced indexing, seen as (N, 3, side, side): channels-last memory, as the
        # network wants it on CUDA.
        return batch[images, :, rows_[:, :, None], columns_[:, None, :]].permute(0, 3, 1, 2)

    def _to_device(self, indexes: torch.Tensor) -> torch.Tensor:
        """Host tensor to the device without waiting: a copy from pageable memory first waits for everything queued
        on the device (the step before), so the next step's work could not be queued ahead."""
        if self.device.type != "cuda":
            return indexes
        return indexes.pin_memory().to(self.device, non_blocking=True)

    def finish(self, batch: torch.Tensor, training: bool = True) -> torch.Tensor:
        """A decoded batch (``decode``) augmented when ``training``, and normalised."""
        return self.transform.normalize(self.augment(batch) if training else batch)

    def __call__(self, payloads: PackedPayloads | Sequence[torch.Tensor], training: bool = True) -> torch.Tensor:
        return self.finish(self.decode(payloads), training)


_END = object()


class DecodedAhead:
    """A loader of (payloads, labels) as (decoded uint8 batch, labels): a thread decodes (``pipeline.decode``) up to
    ``ahead`` batches before the consumer asks, on a CUDA stream of its own, so the consumer's step does not wait
    for decoding, which waits on the host (nvJPEG's batched call returns when its images are done). The random
    options stay with the consumer (``DevicePipeline.finish``): their numbers are drawn in the consumer's thread, in
    its order, as without the thread."""

    def __init__(self, loader, pipeline: DevicePipeline, ahead: int = 2) -> None:
        self.loader, self.pipeline, self.ahead = loader, pipeline, ahead

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        device = self.pipeline.device
        cuda = device.type == "cuda"
        ready: Queue = Queue(maxsize=self.ahead)
        stop = threading.Event()

        def decode_ahead() -> None:
            try:
                stream = torch.cuda.Stream(device) if cuda else None
                with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                    for payloads, labels in self.loader:
                        if stop.is_set():
                            return
                        images = self.pipeline.decode(payloads)
                        event = stream.record_event() if cuda else None
                        ready.put((images, labels, event))
                ready.put(_END)
            except BaseException as error:  # handed to the consumer, raised there with its traceback
                ready.put(error)

        thread = threading.Thread(target=decode_ahead, name="decode-ahead", daemon=True)
        thread.start()
        try:
            while (item := ready.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                images, labels, event = item
                if event is not None:  # the consumer's stream waits for the decoding and keeps the batch's block
                    consumer = torch.cuda.current_stream(device)
                    consumer.wait_event(event)
                    images.record_stream(consumer)
                yield images, labels
        finally:
            stop.set()
            while thread.is_alive():  # free a producer blocked on a full queue, so it sees the stop
                with contextlib.suppress(Empty):
                    ready.get(timeout=0.1)
