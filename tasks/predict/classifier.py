"""A trained model on a few photos, at once: no conversion, no Prefect server, nothing written.

    from tasks.predict.classifier import Classifier
    classifier = Classifier.load("digits-resnet18@production", registry="registry")
    for prediction in classifier.predict(["photo.jpg", "IMG_0042.HEIC"]):
        print(prediction.image, prediction.label, prediction.top(3))

The photos go through scoring's own decode and transforms (``ImageFiles`` with the model's deterministic
transformations: EXIF orientation applied, RGB, resize and crop, normalise), so a photo gets the probabilities
``score_images`` gives it (tests/predict/test_classifier.py). ``image-classifier predict`` (``flows/predict.py``) is the command line.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from PIL import UnidentifiedImageError

from tasks.contracts.model_directory import ModelDirectory
from tasks.convert.storing import HEIF_READER  # noqa: F401 (registers the HEIC opener with Pillow)
from tasks.errors import PipelineInputError
from tasks.registry.fetch import load_model
from tasks.vision.images import ImageFiles
from tasks.vision.networks import load_trained_model
from tasks.vision.transforms import eval_transform


class PhotoError(PipelineInputError):
    """A photo given to predict that is missing or not an image Pillow reads."""


class Prediction(NamedTuple):
    image: str  # as the caller named it
    label: str  # the most probable class
    probabilities: dict[str, float]  # every class, in the model's class order

    def top(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` most probable (class, probability) pairs, most probable first (ties: the class listed first)."""
        order = np.argsort(-np.array(list(self.probabilities.values())), kind="stable")[:k]
        names = list(self.probabilities)
        return [(names[i], self.probabilities[names[i]]) for i in order]


class Classifier:
    """A trained model held in memory, on the CPU (or ``device``), ready for photos."""

    def __init__(self, model_dir: ModelDirectory, device: str | torch.device = "cpu") -> None:
        spec = model_dir.spec
        self.classes = list(model_dir.classes)
        self.device = torch.device(device)
        self.model = load_trained_model(model_dir, self.device)
        self.transform = eval_transform(spec.transformations, spec.image_size, spec.mean, spec.std)

    @classmethod
    def load(cls, model: str | os.PathLike[str], registry: str = "registry", device: str = "cpu") -> Classifier:
        """A ModelDirectory path, or a registry reference (``name``, ``name/3``, ``name@production``) in
        ``registry`` (a folder or ``s3://…``): its files checked against their registered sha256 and read into
        memory; a download from S3 goes to a temporary folder removed before this returns."""
        with tempfile.TemporaryDirectory(prefix="image-classifier-predict-") as cache:
            return cls(load_model(os.fspath(model), registry, cache), device)

    @torch.inference_mode()
    def predict(self, photos: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Prediction]:
        """One Prediction per photo, in order."""
        names = [os.fspath(photos)] if isinstance(photos, str | os.PathLike) else [os.fspath(p) for p in photos]
        files = ImageFiles([(Path(name), -1) for name in names], self.transform, normalized=False)
        predictions = []
        for i, name in enumerate(names):
            pixels = self._decode(files, i, name)
            logits = self.model(self.transform.normalize(pixels[None].to(self.device)))
            probabilities = torch.softmax(logits.float(), dim=1)[0].cpu().numpy()
            values = {label: float(p) for label, p in zip(self.classes, probabilities)}
            predictions.append(Prediction(name, self.classes[int(probabilities.argmax())], values))
        return predictions

    @staticmethod
    def _decode(files: ImageFiles, i: int, name: str) -> torch.Tensor:
        if not Path(name).is_file():
            raise PhotoError(f"{name}: no such file")
        try:
            return files[i][0]
        except UnidentifiedImageError:
            raise PhotoError(f"{name}: not an image Pillow can read (JPEG, PNG, WebP, HEIC, AVIF, …)") from None
        except (OSError, SyntaxError, ValueError) as error:
            raise PhotoError(f"{name}: damaged or truncated image ({error})") from None
