"""One served model version: its files checked and loaded, an image's bytes to the uint8 tensor the batch needs,
a batch to its probabilities.

The photos go through scoring's own decode and transforms (``tasks.vision``: EXIF orientation applied, RGB,
the model's deterministic transformations, normalised where the network runs), so a photo gets the probabilities
``predict`` and ``score`` give it (tests/serving). On CUDA a JPEG is decoded on the device with the rest of its
batch (``DevicePipeline``, as scoring does); elsewhere, and for other formats, PIL decodes it in a thread.
Imports no Prefect.
"""

from __future__ import annotations

import io
import logging
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from tasks.contracts.model_directory import WEIGHTS_FILE, ModelDirectory
from tasks.contracts.registry_layout import reference_or_folder
from tasks.contracts.scores_table import Runtime
from tasks.convert.storing import HEIF_READER  # noqa: F401 (registers the HEIC opener with Pillow)
from tasks.errors import PipelineInputError
from tasks.registry.core import Registry, resolve
from tasks.registry.fetch import fetch_model
from tasks.storage.local_files import sha256_file
from tasks.vision.device_pipeline import DevicePipeline
from tasks.vision.images import upright_rgb
from tasks.vision.networks import load_trained_model, memory_format
from tasks.vision.payloads import JPEG_START
from tasks.vision.transforms import eval_transform

logger = logging.getLogger("tasks.serving")


class ImageRefused(PipelineInputError):
    """An image a request sent that is not served: ``part`` names it in the request, ``status`` is the HTTP status
    it gets (400 unreadable, 413 too many pixels)."""

    def __init__(self, part: str, reason: str, status: int = 400) -> None:
        super().__init__(f"{part}: {reason}")
        self.part, self.status = part, status


@dataclass(frozen=True)
class Identity:
    """Which model answers: what ``/v1/model`` shows and each response's ``X-Model-Version`` header carries."""

    name: str
    version: int | None  # None: a ModelDirectory served from a path
    alias: str | None  # the alias followed, when MODEL named one
    sha256: str  # of the weights file (model.pt)
    runtime: Runtime
    source: str  # the registry, or the ModelDirectory's path

    @property
    def label(self) -> str:
        """``name/3``, or the folder's name for a ModelDirectory."""
        return self.name if self.version is None else f"{self.name}/{self.version}"


def locate(model: str, registry: Registry, cache_dir: Path, runtime: Runtime) -> tuple[ModelDirectory, Identity]:
    """A ModelDirectory path, or a registry reference resolved now (an alias to the version it names): its files
    checked against their registered sha256 (a local registry's version folder itself; from S3 a download into
    ``cache_dir``), and who it is."""
    reference = reference_or_folder(model)
    if reference is None:
        model_dir = ModelDirectory(model)
        weights = sha256_file(model_dir.weights_path)
        return model_dir, Identity(model_dir.root.resolve().name, None, None, weights, runtime, str(model_dir.root))
    registration = resolve(registry, reference)
    model_dir = fetch_model(registry, f"{registration.name}/{registration.version}", cache_dir)
    identity = Identity(
        registration.name,
        registration.version,
        reference.alias,
        registration.files[WEIGHTS_FILE],
        runtime,
        os.fspath(registry) if isinstance(registry, str | os.PathLike) else registry.location,
    )
    return model_dir, identity


def without_the_gil(network: torch.nn.Module, side: int) -> torch.nn.Module:
    """The network traced (TorchScript): one call runs every layer in C++ without taking Python's GIL between
    them, the same kernels in the same order (the logits equal eager's to the bit). In the endpoint's process the
    event loop holds the GIL while it reads requests and writes answers; an eager forward pass takes it back at every
    layer and waited: 2,007 vs 382 ms for a batch of 16 beside a busy Python thread, traced 1,181 ms
    (BENCHMARKS.md, serving). A network that cannot be traced is served eager."""
    example = torch.zeros((1, 3, side, side))
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # torch.jit's deprecation notice
            return torch.jit.trace(network, example, check_trace=False)
    except Exception as error:  # noqa: BLE001 (a network with data-dependent control flow)
        logger.warning("served eager: the network could not be traced (%s: %s)", type(error).__name__, error)
        return network


class ServedModel:
    """A trained model in memory, ready for batches: ``decode`` one image's bytes (in any thread), ``forward`` a
    batch of decoded images (in the one thread that runs the network)."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        identity: Identity,
        *,
        device: str | torch.device = "cpu",
        max_pixels: int,
    ) -> None:
        spec = model_dir.spec
        self.model_dir, self.identity, self.max_pixels = model_dir, identity, max_pixels
        self.classes = list(model_dir.classes)
        self.transform = eval_transform(spec.transformations, spec.image_size, spec.mean, spec.std)
        self.side = self.transform.size
        if identity.runtime == "onnx":
            from tasks.evaluation.onnx_export import INPUT_NAME, OUTPUT_NAME, onnx_session

            self.device = torch.device("cpu")
            self._session, self._names = onnx_session(model_dir), (INPUT_NAME, OUTPUT_NAME)
        else:
            self.device = torch.device(device)
            network = load_trained_model(model_dir, self.device).to(memory_format=memory_format(self.device))
            self._network = without_the_gil(network, self.side) if self.device.type == "cpu" else network
        self._pipeline = (
            DevicePipeline(self.transform, spec.transformations, spec.image_size, self.device)
            if self.device.type == "cuda"
            else None
        )

    def decode(self, data: bytes, part: str) -> torch.Tensor:
        """One image's bytes to what ``forward`` takes: the uint8 (3, side, side) image after the deterministic
        transformations, or, on CUDA, a JPEG's bytes (a 1-D uint8 tensor) for the device to decode with its batch.
        Refused (``ImageRefused``, naming ``part``) when Pillow cannot read it or it has more than ``max_pixels``
        pixels: the size comes from the header, so a decompression bomb is never decoded."""
        if not data:
            raise ImageRefused(part, "empty: no image bytes were sent")
        try:
            with Image.open(io.BytesIO(data)) as image:
                pixels = image.width * image.height
                if pixels > self.max_pixels:
                    raise ImageRefused(
                        part,
                        f"{image.width} x {image.height} = {pixels:,} pixels, more than the {self.max_pixels:,} "
                        "this server decodes (--max-image-pixels)",
                        413,
                    )
                if self._pipeline is not None and data.startswith(JPEG_START):
                    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
                return self.transform.decode(upright_rgb(image))
        except ImageRefused:
            raise
        except Image.DecompressionBombError as error:  # past twice Pillow's own limit: refused by Image.open
            raise ImageRefused(part, f"refused as a decompression bomb ({error})", 413) from None
        except UnidentifiedImageError:
            raise ImageRefused(part, "not an image Pillow can read (JPEG, PNG, WebP, HEIC, AVIF, …)") from None
        except (OSError, SyntaxError, ValueError) as error:
            raise ImageRefused(part, f"damaged or truncated image ({error})") from None

    def run(
        self, items: Sequence[tuple[bytes, str]], decoder: Executor | None = None
    ) -> list[np.ndarray | ImageRefused]:
        """A batch from its encoded images ((bytes, part) each): decoded (``decoder``'s threads, else here), then one
        forward pass for those that decoded; per item its probabilities, or the ImageRefused that refused it.

        Decoding and the network take turns in the one thread that runs batches: on a CPU both use every core
        and running them at once slowed the network more than it hid the decoding (bench/serve.py: LitServe,
        which decodes then predicts in one worker, was ahead of decoding threads beside the network)."""
        decoded = list(decoder.map(self._decode_or_refusal, items) if decoder else map(self._decode_or_refusal, items))
        good = [i for i, image in enumerate(decoded) if not isinstance(image, ImageRefused)]
        results: list[np.ndarray | ImageRefused] = list(decoded)  # type: ignore[arg-type]
        if good:
            for i, probabilities in zip(good, self.forward([decoded[i] for i in good]), strict=True):
                results[i] = probabilities
        return results

    def _decode_or_refusal(self, item: tuple[bytes, str]) -> torch.Tensor | ImageRefused:
        try:
            return self.decode(*item)
        except ImageRefused as refused:
            return refused

    @torch.inference_mode()
    def forward(self, images: Sequence[torch.Tensor]) -> np.ndarray:
        """The probabilities (N, classes) of a batch of ``decode``'s results, in order: one forward pass."""
        if self._pipeline is not None:
            batch = self._pipeline.decode(list(images))
        else:
            batch = torch.stack(list(images))
        batch = self.transform.normalize(batch.to(self.device, non_blocking=True))
        if self.identity.runtime == "onnx":
            input_name, output_name = self._names
            return self._session.run([output_name], {input_name: batch.numpy()})[0]
        batch = batch.contiguous(memory_format=memory_format(self.device))
        return torch.softmax(self._network(batch).float(), dim=1).cpu().numpy()

    def warm(self, batch_sizes: Sequence[int]) -> None:
        """One forward pass per batch size, of black images, before the model takes requests: the first calls
        allocate, and on CUDA pick kernels."""
        black = torch.zeros((3, self.side, self.side), dtype=torch.uint8)
        if self._pipeline is not None:  # the device's JPEG decoder too
            encoded = io.BytesIO()
            Image.new("RGB", (self.side, self.side)).save(encoded, format="JPEG")
            black = self.decode(encoded.getvalue(), "warm-up")
        for size in sorted(set(batch_sizes)):
            self.forward([black] * size)
