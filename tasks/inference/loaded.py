"""One trained model loaded for inference: what ``predict``, scoring (and its shards), the endpoint and the benchmarks
all hold. An image's bytes or file to the uint8 tensor a batch takes (``decode``: EXIF orientation, RGB, HEIC, the
model's deterministic transformations; a typed ``UnreadableImageError`` for what cannot be read), a batch to its
probabilities and penultimate-layer embeddings (``outputs``), on the runtime and precision asked for.

    model = LoadedModel.load("digits-resnet18@production", registry="registry")
    probabilities = model.probabilities([model.decode(path) for path in ["a.png", "b.jpg"]])

On CUDA a JPEG is decoded on the device with the rest of its batch (``DevicePipeline``); elsewhere, and for other
formats, Pillow decodes it on the CPU. Imports no Prefect."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, get_args

import numpy as np
import torch
from PIL import Image

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.scores_table import Precision, Runtime
from tasks.errors import PipelineInputError, UnreadableImageError
from tasks.inference.networks import OnnxNetwork, Outputs, TorchNetwork, most_probable, probabilities_of
from tasks.registry.core import Registry
from tasks.registry.fetch import load_model
from tasks.vision.device_pipeline import DevicePipeline
from tasks.vision.images import ImageSource, decode_image, open_image, part_of
from tasks.vision.payloads import JPEG_START
from tasks.vision.transforms import eval_transform

PRECISIONS: tuple[str, ...] = get_args(Precision)
RUNTIMES: tuple[str, ...] = get_args(Runtime)


class Prediction(NamedTuple):
    """One image's answer: what predict prints and the endpoint sends."""

    image: str  # as the caller named it
    label: str  # the most probable class
    probabilities: dict[str, float]  # every class, in the model's class order

    def top(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` most probable (class, probability) pairs, most probable first (ties: the class listed first)."""
        names = list(self.probabilities)
        order = most_probable(np.array([list(self.probabilities.values())]), k)[0]
        return [(names[i], self.probabilities[names[i]]) for i in order]


def check_choices(runtime: str, precision: str, device: torch.device) -> None:
    """A runtime and precision this device can run: one clear line for any other."""
    if runtime not in RUNTIMES:
        raise PipelineInputError(f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
    if precision not in PRECISIONS:
        raise PipelineInputError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if runtime == "onnx" and precision != "fp32":
        raise PipelineInputError(f"runtime 'onnx' runs model.onnx as exported (fp32), not {precision}: use fp32")
    if precision == "int8" and device.type != "cpu":
        raise PipelineInputError(f"precision 'int8' runs on the CPU (ONNX Runtime), not on {device}: use bf16 there")


class LoadedModel:
    """A trained ModelDirectory in memory, ready for batches: ``decode`` one image (in any thread), ``outputs`` or
    ``probabilities`` of a batch of decoded images (in the one thread that runs the network)."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        *,
        runtime: Runtime = "torch",
        precision: Precision = "fp32",
        device: str | torch.device = "cpu",
        max_pixels: int | None = None,
        threads: int | None = None,
        calibration: str | os.PathLike[str] | ImageDirectory | None = None,
    ) -> None:
        """``calibration``: the version's validation ImageDirectory, for ``precision="int8"`` the first time
        (tasks/inference/int8.py); ``threads``: ONNX Runtime's (its default: one per core)."""
        spec = model_dir.spec
        self.device = torch.device(device)
        check_choices(runtime, precision, self.device)
        self.model_dir, self.runtime, self.max_pixels = model_dir, runtime, max_pixels
        self.classes = list(model_dir.classes)
        self.transform = eval_transform(spec.transformations, spec.image_size, spec.mean, spec.std)
        self.side = self.transform.size
        if precision == "int8":
            from tasks.inference.int8 import int8_network

            self.network, self.precision = int8_network(model_dir, threads, calibration)
        elif runtime == "onnx":
            self.network, self.precision = OnnxNetwork.exported(model_dir, threads), precision
        else:
            self.network = TorchNetwork(model_dir, self.device, self.side, bf16=precision == "bf16")
            self.precision = precision
        self.device = self.network.device
        self.pipeline = (
            DevicePipeline(self.transform, spec.transformations, spec.image_size, self.device)
            if self.device.type == "cuda"
            else None
        )

    @classmethod
    def load(cls, model: str | os.PathLike[str], registry: Registry = "registry", **options) -> LoadedModel:
        """A ModelDirectory path, or a registry reference (``name``, ``name/3``, ``name@production``) in ``registry``
        (a folder or ``s3://…``): its files checked against their registered sha256 and read into memory; a download
        from S3 goes to a temporary folder removed before this returns."""
        with tempfile.TemporaryDirectory(prefix="image-classifier-model-") as cache:
            return cls(load_model(os.fspath(model), registry, cache), **options)

    def decode(self, source: ImageSource, part: str | None = None) -> torch.Tensor:
        """One image (a file's path or its bytes) to what ``outputs`` takes: the uint8 (3, side, side) image after the
        deterministic transformations, or, on CUDA, a JPEG's bytes (a 1-D uint8 tensor) for the device to decode with
        its batch. ``UnreadableImageError`` (naming ``part``) when it cannot be read or has more than
        ``max_pixels`` pixels: the size comes from the header, so a decompression bomb is never decoded."""
        if self.pipeline is None:
            return decode_image(source, self.transform, part, self.max_pixels)
        if not isinstance(source, bytes | bytearray | memoryview):  # a path: its bytes, for the device to decode
            part = part_of(source, part)
            try:
                source = Path(source).read_bytes()
            except FileNotFoundError:
                raise UnreadableImageError(part, "no such file") from None
        open_image(source, part, self.max_pixels).close()  # the header: unreadable or too many pixels refused here
        if bytes(source[:3]) == JPEG_START:
            return torch.frombuffer(bytearray(source), dtype=torch.uint8)
        return decode_image(source, self.transform, part, self.max_pixels)

    def batch(self, images: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """``decode``'s results (or a uint8 batch) as one normalised float batch where the network runs."""
        if self.pipeline is not None and not isinstance(images, torch.Tensor):
            batch = self.pipeline.decode(list(images))
        else:
            batch = images if isinstance(images, torch.Tensor) else torch.stack(list(images))
        return self.transform.normalize(batch.to(self.device, non_blocking=True))

    def outputs(self, images: Sequence[torch.Tensor] | torch.Tensor) -> Outputs:
        """One forward pass: the batch's logits or probabilities and its embeddings, where the network ran."""
        return self.network(self.batch(images))

    def probabilities(self, images: Sequence[torch.Tensor] | torch.Tensor) -> np.ndarray:
        """The probabilities (N, classes) of a batch of ``decode``'s results, in order, on the host."""
        return probabilities_of(self.outputs(images)).cpu().numpy()

    def predictions(self, names: Sequence[str], probabilities: np.ndarray) -> list[Prediction]:
        """Each row of ``probabilities`` as the Prediction of the image named alike."""
        return [
            Prediction(name, self.classes[int(row.argmax())], dict(zip(self.classes, row.tolist(), strict=True)))
            for name, row in zip(names, probabilities, strict=True)
        ]

    def embeddings(self, images: Sequence[torch.Tensor] | torch.Tensor) -> np.ndarray:
        """The penultimate-layer embeddings (N, features) of a batch, float32 on the host."""
        found = self.outputs(images).embeddings
        if found is None:
            raise PipelineInputError(
                f"runtime {self.runtime!r} runs model.onnx, which gives probabilities only: use runtime 'torch' "
                "(or precision 'int8') for embeddings"
            )
        return found.float().cpu().numpy()

    def warm(self, batch_sizes: Sequence[int]) -> None:
        """One forward pass per batch size, of black images: the first calls allocate, and on CUDA pick kernels."""
        black = torch.zeros((3, self.side, self.side), dtype=torch.uint8)
        if self.pipeline is not None:  # the device's JPEG decoder too
            encoded = io.BytesIO()
            Image.new("RGB", (self.side, self.side)).save(encoded, format="JPEG")
            black = self.decode(encoded.getvalue(), "warm-up")
        for size in sorted(set(batch_sizes)):
            self.probabilities([black] * size)

    def describe(self) -> dict[str, str]:
        """Runtime, precision and device: what a model record shows."""
        return {"runtime": self.runtime, "precision": self.precision, "device": str(self.device)}
