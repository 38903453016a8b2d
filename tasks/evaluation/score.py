"""Score Image Model: a trained ModelDirectory scores an ImageDirectory into Azure's table shape.

Images run through the network in batches under ``torch.inference_mode()``, with PyTorch or, when asked, with
onnxruntime on the directory's ``model.onnx``. On CUDA, threads read the next files into pinned memory, a thread
decodes JPEGs on the GPU a batch or two ahead (on a stream of its own), and each batch's probabilities come back
to pinned memory without waiting: the table is built from one batch while the next runs. Elsewhere a DataLoader
decodes. The model is the one loaded model of ``tasks.inference``: ``precision="bf16"`` runs it under bf16 autocast,
``"int8"`` quantized by ONNX Runtime on the CPU.
Scoring sets this process's allocator to keep freed memory (tasks/allocator.py): each batch then reuses its
blocks instead of page-faulting them in afresh.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Literal, TypedDict, Unpack

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from tasks.allocator import keep_freed_memory
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.scores_table import (
    BATCH_SIZE,
    IMAGE_COLUMN,
    LABEL_COLUMN,
    SCORED_LABELS,
    Precision,
    Runtime,
    probability_column,
    top_k_columns,
)
from tasks.errors import InvalidDatasetError, PipelineInputError
from tasks.inference.loaded import LoadedModel
from tasks.inference.networks import most_probable, probabilities_of
from tasks.vision.device_pipeline import DecodedAhead, DevicePipeline
from tasks.vision.images import ImageFiles
from tasks.vision.payloads import EncodedImageFiles, PackedPayloads, collate_payloads, threaded_batches

DecodeOn = Literal["cpu", "device"]


class ScoringOptions(TypedDict, total=False):
    """``score_images``' options, each with ``score_chunks``' default."""

    batch_size: int  # images per forward pass (BATCH_SIZE)
    runtime: Runtime  # "torch" (the default) or "onnx" (onnxruntime on the exported model.onnx)
    top_k: int  # > 0: Top 1 ... Top k label and probability columns too (0)
    precision: Precision  # "fp32" (the default; TF32 convolutions on CUDA), "bf16" autocast, or "int8" (CPU)
    calibration: str  # int8 the first time: the model's validation ImageDirectory (tasks/inference/int8.py)
    decode_on: DecodeOn  # torch: "device" (the default on CUDA): threads read, the device decodes; "cpu" (elsewhere)


Probabilities = Callable[[], np.ndarray]  # a batch's probabilities, once they are on the host


@dataclasses.dataclass
class Span:
    """The index rows a scoring covers (``start`` to ``stop``), and the images of them it could not read or
    decode: index row -> why (filled as it scores)."""

    start: int
    stop: int
    failed: dict[int, str] = dataclasses.field(default_factory=dict)
    first_at: float | None = None  # when its first batch's probabilities came back (Unix time)


# What reading or decoding one damaged image raises (PIL, torchvision's decoders); a tolerant scoring notes it.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, Image.DecompressionBombError)


def decode_error(error: BaseException) -> str:
    """Why an image could not be decoded, as its row's error; a device out of memory is raised again: it is no
    image's fault."""
    if isinstance(error, torch.OutOfMemoryError):  # the device's fault, not the image's
        raise error
    return f"{type(error).__name__}: {error}"


class TolerantImageFiles(Dataset):
    """``files`` (a span's images: ImageFiles, or EncodedImageFiles for the device path), where an image that cannot
    be read or decoded here comes as a black image and its error is noted in ``span.failed``: its row gets no
    scores, the rest of its batch is scored."""

    def __init__(self, files: ImageFiles | EncodedImageFiles, span: Span) -> None:
        self.files, self.span = files, span

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        try:
            return self.files[i]
        except DECODE_ERRORS as error:
            self.span.failed.setdefault(self.span.start + i, decode_error(error))
            side = self.files.transform.size
            return torch.zeros((3, side, side), dtype=torch.uint8), self.files.samples[i][1]


class TolerantDecode:
    """A DevicePipeline's ``decode`` for a span's batches, in order: when a batch fails to decode (a damaged JPEG
    fails nvJPEG's whole batched call), its images are decoded one by one, and one that fails alone comes as a
    black image noted in ``span.failed``."""

    def __init__(self, pipeline: DevicePipeline, span: Span, batch_size: int) -> None:
        self.pipeline, self.span, self.batch_size, self.batches = pipeline, span, batch_size, 0
        self.device = pipeline.device

    def decode(self, payloads: PackedPayloads | list[torch.Tensor]) -> torch.Tensor:
        first, self.batches = self.span.start + self.batches * self.batch_size, self.batches + 1
        try:
            return self.pipeline.decode(payloads)
        except DECODE_ERRORS as error:
            decode_error(error)
        side, images = self.pipeline.transform.size, []
        for i, payload in enumerate(payloads.unpack() if isinstance(payloads, PackedPayloads) else payloads):
            try:
                images.append(self.pipeline.decode([payload])[0])
            except DECODE_ERRORS as error:
                self.span.failed.setdefault(first + i, decode_error(error))
                images.append(torch.zeros((3, side, side), dtype=torch.uint8, device=self.device))
        return torch.stack(images)


def ready(probabilities: np.ndarray) -> Probabilities:
    return lambda: probabilities


def host_probabilities(model: LoadedModel, batch: torch.Tensor) -> Probabilities:
    """A normalised batch's probabilities when asked. On CUDA the network's work and the copy of its output to pinned
    host memory are queued and the call returns: asking for the probabilities waits for that batch alone, so the host
    builds the table of one batch while the next runs."""
    probabilities = probabilities_of(model.network(batch))
    if model.device.type != "cuda":
        return ready(probabilities.numpy())
    # Pinned blocks come from torch's caching host allocator: freed with the batch's array, reused by the next.
    host = torch.empty(probabilities.shape, dtype=probabilities.dtype, pin_memory=True)
    host.copy_(probabilities, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return lambda: (copied.synchronize(), host.numpy())[1]


def pinned_payloads(items: list) -> tuple[PackedPayloads, torch.Tensor]:
    """``collate_payloads`` with the packed bytes in pinned memory (a reading thread pins them, not the decoder)."""
    payloads, labels = collate_payloads(items)
    return PackedPayloads(payloads.data.pin_memory(), payloads.shapes), labels


def batches_and_predictor(
    model: LoadedModel,
    images: ImageDirectory,
    batch_size: int,
    decode_on: DecodeOn | None = None,
    span: Span | None = None,
) -> tuple[Iterable, Callable[[object], Probabilities]]:
    """(the batches of images in order, batch -> its probabilities when asked). With ``decode_on="device"`` (the
    default on CUDA), threads read the files and a thread decodes and transforms the JPEGs on the device in whole
    batches (tasks/vision/device_pipeline.py) ahead of the network; with "cpu" (the default elsewhere) a
    DataLoader decodes uint8 images here and each batch is normalised where the network runs. With a ``span``, its
    images only, and an image that fails to read or decode (on either path) is noted in it instead of failing."""
    spec, transform = model.model_dir.spec, model.transform
    samples = images.samples(span.start, span.stop) if span else images.samples()
    if model.runtime == "torch" and (decode_on == "device" or (decode_on is None and model.device.type == "cuda")):
        pipeline = model.pipeline or DevicePipeline(transform, spec.transformations, spec.image_size, model.device)
        encoded = EncodedImageFiles(samples, transform)
        dataset = TolerantImageFiles(encoded, span) if span else encoded
        collate = pinned_payloads if model.device.type == "cuda" else collate_payloads
        read = threaded_batches(dataset, batch_size, collate, threads=min(8, os.cpu_count() or 1))
        decoded = DecodedAhead(read, TolerantDecode(pipeline, span, batch_size) if span else pipeline)
        return decoded, lambda batch: host_probabilities(model, pipeline.finish(batch[0], training=False))
    files = ImageFiles(samples, transform, normalized=False)
    loader = DataLoader(TolerantImageFiles(files, span) if span else files, batch_size=batch_size)
    return loader, lambda batch: host_probabilities(model, model.batch(batch[0]))


def score_chunks(
    model_dir: ModelDirectory,
    images: ImageDirectory,
    batch_size: int = BATCH_SIZE,
    runtime: Runtime = "torch",
    top_k: int = 0,
    chunk_rows: int | None = None,
    precision: Precision = "fp32",
    decode_on: DecodeOn | None = None,
    span: Span | None = None,
    calibration: str | None = None,
) -> Iterator[pd.DataFrame]:
    """``score_images``' table ``chunk_rows`` rows at a time (by default about 4 million probabilities' worth,
    whatever the number of classes), in the images' order, at least one chunk (it names the columns): what
    ``write_score_chunks`` writes as it comes. The arguments are checked and the model loaded at once. With a
    ``span``, only the images from ``span.start`` to ``span.stop`` (index rows), and an image that cannot be read or
    decoded is noted in ``span.failed`` with its row left without scores instead of failing the scoring."""
    if top_k < 0:
        raise PipelineInputError(f"top_k {top_k} is not allowed: use 0 (no top-k columns) or a number of labels >= 1")
    if images.labeled and not set(images.classes) <= set(model_dir.classes):
        unknown = sorted(set(images.classes) - set(model_dir.classes))
        raise InvalidDatasetError(
            f"{images.root} has classes {unknown} the model {model_dir.root} was not trained on "
            f"(it knows {model_dir.classes})"
        )
    # bf16 autocast is not the default: scoring is bound by reading and decoding, and the casts cost more than they
    # save (BENCHMARKS.md). int8 and ONNX Runtime run on the CPU whatever the host has.
    device = "cuda" if torch.cuda.is_available() and precision != "int8" and runtime == "torch" else "cpu"
    model = LoadedModel(model_dir, runtime=runtime, precision=precision, device=device, calibration=calibration)
    rows = chunk_rows or max(batch_size, min(8192, 2**22 // max(1, len(model_dir.classes))))
    return _chunks(model, images, batch_size, top_k, rows, decode_on, span)


def _chunks(
    model: LoadedModel,
    images: ImageDirectory,
    batch_size: int,
    top_k: int,
    rows: int,
    decode_on: DecodeOn | None,
    given: Span | None,
) -> Iterator[pd.DataFrame]:
    keep_freed_memory()  # batch after batch of the same shapes: reuse the blocks instead of faulting them in
    # Without a span: every image, and one that cannot be decoded fails the scoring (nothing tolerated).
    batches, predict = batches_and_predictor(model, images, batch_size, decode_on, given)
    span, model_dir = given or Span(0, len(images)), model.model_dir
    pending, start = [], span.start
    for probabilities in _one_behind(batches, predict):
        span.first_at = span.first_at or time.time()
        pending.append(probabilities)
        if len(pending) * batch_size >= rows:  # every batch but the last is full
            probabilities, pending = np.concatenate(pending), []
            yield _table(model_dir, images, probabilities, start, top_k, span.failed)
            start += len(probabilities)
    if pending or start == span.start:
        empty = np.empty((0, len(model_dir.classes)), dtype=np.float32)
        yield _table(model_dir, images, np.concatenate(pending) if pending else empty, start, top_k, span.failed)


def _one_behind(batches: Iterable, predict: Callable[[object], Probabilities]) -> Iterator[np.ndarray]:
    """Each batch's probabilities, in order, a batch behind: batch k's are read while batch k + 1 runs."""
    queued: deque[Probabilities] = deque()
    for batch in batches:
        queued.append(predict(batch))
        if len(queued) > 1:
            yield queued.popleft()()
    while queued:
        yield queued.popleft()()


def _table(
    model_dir: ModelDirectory,
    images: ImageDirectory,
    probabilities: np.ndarray,
    start: int,
    top_k: int,
    failed: dict[int, str] | None = None,
) -> pd.DataFrame:
    """The rows of the images from ``start`` on, one per row of ``probabilities``; the rows of ``failed`` images
    (index row -> why) have no scores."""
    index, stop = images.index, start + len(probabilities)
    missing = [i - start for i in (failed or {}) if start <= i < stop]
    if missing:
        probabilities = probabilities.astype(np.float32, copy=True)
        probabilities[missing] = np.nan
    # The user's own name for each image, not the name it was stored under (escaped, renamed on collision).
    table = pd.DataFrame({IMAGE_COLUMN: [index.source_path[i] or index.path[i] for i in range(start, stop)]})
    best = (np.nan_to_num(probabilities, nan=-1.0) if missing else probabilities).argmax(axis=1)
    table[SCORED_LABELS] = [model_dir.classes[i] for i in best]
    for column, name in enumerate(model_dir.classes):
        table[probability_column(name)] = probabilities[:, column]
    # Stable sort: of equal probabilities the class listed first ranks first, as argmax picks it.
    ranked = most_probable(probabilities, top_k)
    for rank in range(ranked.shape[1]):
        label, probability = top_k_columns(rank + 1)
        table[label] = [model_dir.classes[i] for i in ranked[:, rank]]
        table[probability] = np.take_along_axis(probabilities, ranked[:, rank : rank + 1], axis=1)[:, 0]
    if images.labeled:
        codes = np.asarray(index.label[start:stop])
        table[LABEL_COLUMN] = pd.Categorical.from_codes(codes, images.classes).astype(object)
    if missing:  # no scored label, no top-k labels either
        labels = [SCORED_LABELS, *(top_k_columns(rank + 1)[0] for rank in range(min(top_k, len(model_dir.classes))))]
        table.loc[missing, labels] = None
    return table


def score_images(model_dir: ModelDirectory, images: ImageDirectory, **options: Unpack[ScoringOptions]) -> pd.DataFrame:
    """One row per image: ``image``, ``Scored Labels``, ``Scored Probabilities_<class>``..., with ``top_k`` > 0
    ``Top 1 Label``, ``Top 1 Probability`` ... ``Top k ...`` (k at most the number of classes), and ``label``
    when known. The whole table in memory: the stage writes it chunk by chunk instead (``score_chunks``)."""
    chunks = list(score_chunks(model_dir, images, **options))
    return chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
