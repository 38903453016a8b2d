"""A trained model on a few photos, at once: no conversion, no Prefect server, nothing written.

    from tasks.predict.classifier import Classifier
    classifier = Classifier.load("digits-resnet18@production", registry="registry")
    for prediction in classifier.predict(["photo.jpg", "IMG_0042.HEIC"]):
        print(prediction.image, prediction.label, prediction.top(3))

The photos go through the one loaded model that scores and serves (``tasks.inference``: EXIF orientation applied,
RGB, the model's deterministic transformations, normalise), so a photo gets the probabilities ``score_images`` gives
it (tests/predict/test_classifier.py). ``image-classifier predict`` (``flows/predict.py``) is the command line.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from tasks.inference.loaded import LoadedModel, Prediction


class Classifier:
    """A trained model held in memory (``tasks.inference``'s LoadedModel: the one that scores and serves), on the
    CPU (or ``device``), ready for photos."""

    def __init__(self, model: LoadedModel) -> None:
        self.model, self.classes = model, model.classes

    @classmethod
    def load(cls, model: str | os.PathLike[str], registry: str = "registry", **options) -> Classifier:
        """A ModelDirectory path, or a registry reference (``name``, ``name/3``, ``name@production``) in
        ``registry`` (a folder or ``s3://…``): its files checked against their registered sha256 and read into
        memory; ``options`` are LoadedModel's (``device``, ``runtime``, ``precision``)."""
        return cls(LoadedModel.load(model, registry, **options))

    def predict(self, photos: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Prediction]:
        """One Prediction per photo, in order; a missing or unreadable photo raises ``UnreadableImageError``
        naming it."""
        names = [os.fspath(photos)] if isinstance(photos, str | os.PathLike) else [os.fspath(p) for p in photos]
        # One at a time: a photo answered alone gets the same numbers whatever else is asked.
        return [
            self.model.predictions([name], self.model.probabilities([self.model.decode(name)]))[0] for name in names
        ]
