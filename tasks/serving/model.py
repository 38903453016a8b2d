"""One served model version: its files checked (a registry's version resolved and fetched) and loaded into the one
loaded model of ``tasks.inference``, so a photo gets the probabilities ``predict`` and ``score`` give it
(tests/serving); who it is (``Identity``); a batch of requests' images decoded and run. Imports no Prefect.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

from tasks.contracts.model_directory import WEIGHTS_FILE, ModelDirectory
from tasks.contracts.registry_layout import reference_or_folder
from tasks.contracts.scores_table import Precision, Runtime
from tasks.errors import UnreadableImageError
from tasks.inference.loaded import LoadedModel
from tasks.inference.networks import most_probable, probabilities_of
from tasks.monitoring.recorder import Recorder
from tasks.monitoring.records import TOP, project
from tasks.registry.core import Registry, resolve
from tasks.registry.fetch import fetch_model
from tasks.storage.local_files import sha256_file
from tasks.vision.images import image_properties


@dataclass(frozen=True)
class Identity:
    """Which model answers: what ``/v1/model`` shows and each response's ``X-Model-Version`` header carries."""

    name: str
    version: int | None  # None: a ModelDirectory served from a path
    alias: str | None  # the alias followed, when MODEL named one
    sha256: str  # of the weights file (model.pt)
    runtime: Runtime
    source: str  # the registry, or the ModelDirectory's path
    precision: Precision = "fp32"  # as loaded: int8 asked on a CPU where it does not pay is fp32

    @property
    def label(self) -> str:
        """``name/3``, or the folder's name for a ModelDirectory."""
        return self.name if self.version is None else f"{self.name}/{self.version}"


def locate(
    model: str, registry: Registry, cache_dir: Path, runtime: Runtime, precision: Precision = "fp32"
) -> tuple[ModelDirectory, Identity]:
    """A ModelDirectory path, or a registry reference resolved now (an alias to the version it names): its files
    checked against their registered sha256 (a local registry's version folder itself; from S3 a download into
    ``cache_dir``), and who it is."""
    reference = reference_or_folder(model)
    if reference is None:
        model_dir = ModelDirectory(model)
        weights = sha256_file(model_dir.weights_path)
        name = model_dir.root.resolve().name
        return model_dir, Identity(name, None, None, weights, runtime, str(model_dir.root), precision)
    registration = resolve(registry, reference)
    model_dir = fetch_model(registry, f"{registration.name}/{registration.version}", cache_dir)
    identity = Identity(
        registration.name,
        registration.version,
        reference.alias,
        registration.files[WEIGHTS_FILE],
        runtime,
        os.fspath(registry) if isinstance(registry, str | os.PathLike) else registry.location,
        precision,
    )
    return model_dir, identity


class ServedModel:
    """A served version: the one loaded model (``tasks.inference``) and who it is. ``decode`` one image's bytes (in
    any thread), ``forward`` a batch of decoded images (in the one thread that runs the network)."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        identity: Identity,
        *,
        device: str | torch.device = "cpu",
        max_pixels: int,
        calibration: str | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.model_dir, self.max_pixels, self.recorder = model_dir, max_pixels, recorder
        self.loaded = LoadedModel(
            model_dir,
            runtime=identity.runtime,
            precision=identity.precision,
            device=device,
            max_pixels=max_pixels,
            calibration=calibration,
        )
        self.identity = replace(identity, precision=self.loaded.precision)
        self.classes, self.device, self.side = self.loaded.classes, self.loaded.device, self.loaded.side

    def decode(self, data: bytes, part: str) -> torch.Tensor:
        """One image's bytes to what ``forward`` takes (``LoadedModel.decode``); ``UnreadableImageError`` naming ``part``."""
        return self.loaded.decode(data, part)

    def run(
        self, items: Sequence[tuple[bytes, str]], decoder: Executor | None = None
    ) -> list[np.ndarray | UnreadableImageError]:
        """A batch from its encoded images ((bytes, part) each): decoded (``decoder``'s threads, else here), then one
        forward pass for those that decoded; per item its probabilities, or the UnreadableImageError that refused it.

        Decoding and the network take turns in the one thread that runs batches: on a CPU both use every core
        and running them at once slowed the network more than it hid the decoding (bench/serve.py: LitServe,
        which decodes then predicts in one worker, was ahead of decoding threads beside the network)."""
        decoded = list(decoder.map(self._decode_or_refusal, items) if decoder else map(self._decode_or_refusal, items))
        good = [i for i, image in enumerate(decoded) if not isinstance(image, UnreadableImageError)]
        results: list[np.ndarray | UnreadableImageError] = list(decoded)  # type: ignore[arg-type]
        if good:
            outputs = self.loaded.outputs([decoded[i] for i in good])
            probabilities = probabilities_of(outputs).cpu().numpy()
            for i, row in zip(good, probabilities, strict=True):
                results[i] = row
            if self.recorder is not None:
                self.record([items[i][0] for i in good], probabilities, outputs.embeddings)
        return results

    def record(self, images: Sequence[bytes], probabilities: np.ndarray, embeddings: torch.Tensor | None) -> None:
        """Hand the recorder what this batch answered (the share it samples): off the event loop, and never failing
        the batch (the recorder drops what it cannot keep)."""
        wanted = [i for i in range(len(images)) if self.recorder.wanted()]
        if not wanted:
            return
        projected = project(embeddings[wanted].float().cpu().numpy()) if embeddings is not None else None
        now = datetime.now(UTC).isoformat()
        for n, i in enumerate(wanted):
            row = probabilities[i]
            top = most_probable(row[None], TOP)[0]
            confidence = float(row[top[0]])
            record = {
                "time": now,
                "sha256": hashlib.sha256(images[i]).hexdigest(),
                "model": self.identity.name,
                "version": self.identity.version,
                "precision": self.identity.precision,
                "label": self.classes[top[0]],
                "confidence": confidence,
                "top": {self.classes[j]: float(row[j]) for j in top},
                **image_properties(images[i]),
                "embedding": None if projected is None else projected[n].tolist(),
                "image": None,
            }
            self.recorder.offer(record, images[i] if self.recorder.keeps_image(confidence) else None)

    def _decode_or_refusal(self, item: tuple[bytes, str]) -> torch.Tensor | UnreadableImageError:
        try:
            return self.decode(*item)
        except UnreadableImageError as refused:
            return refused

    def forward(self, images: Sequence[torch.Tensor]) -> np.ndarray:
        """The probabilities (N, classes) of a batch of ``decode``'s results, in order: one forward pass."""
        return self.loaded.probabilities(images)

    def warm(self, batch_sizes: Sequence[int]) -> None:
        self.loaded.warm(batch_sizes)
