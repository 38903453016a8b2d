"""What a version saw on its validation set, kept with it: the reference a window of recorded answers is compared with
(drift.py).

``compute_reference`` runs the one loaded model over a seeded sample of the validation ImageDirectory (at most
``REFERENCE_IMAGES``): the predicted class counts, the top probabilities, the images' width, height, mode and EXIF
orientation (from the directory's index; the orientation from the files' headers where the index has none), and
``EMBEDDING_SAMPLE`` penultimate-layer embeddings through ``records.project`` (the records' own projection).
``save`` writes it as ``reference.json`` (the counts, summaries a person reads, the arrays' sha256) and
``reference.npz`` (the arrays). The pipeline writes both into the model folder before registering, so the registry
hashes and keeps them with the version (``version_reference`` reads them back, checked). A version registered before
gets its reference on first use, from the validation images the user names, stored beside the version (not among
its registered files) with the sha256 of the weights it was computed from. Imports no Prefect."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import REFERENCE_FILES, WEIGHTS_FILE
from tasks.contracts.registry_layout import Registration, version_key
from tasks.errors import CorruptRegistryRecordError, PipelineInputError
from tasks.inference.loaded import LoadedModel
from tasks.inference.networks import probabilities_of
from tasks.monitoring.records import project
from tasks.registry.core import Registry, backend_of, resolve
from tasks.storage.local_files import atomic_write, sha256_file
from tasks.vision.images import image_properties

logger = logging.getLogger("tasks.monitoring")

REFERENCE_FILE, REFERENCE_ARRAYS = REFERENCE_FILES
REFERENCE_IMAGES = 2000  # enough for class shares to about a percent; a validation set of 100,000 costs no more
EMBEDDING_SAMPLE = 500  # the embeddings' two-sample test is quadratic in this
_BATCH = 32
_ARRAYS = ("confidences", "widths", "heights", "embeddings")


@dataclass
class Reference:
    """A version's validation set as the model saw it."""

    classes: list[str]
    predicted: dict[str, int]  # class -> images predicted as it
    modes: dict[str, int]
    orientations: dict[str, int]  # EXIF orientation ("1"-"8") -> images
    confidences: np.ndarray  # (images,) the top probability of each
    widths: np.ndarray  # (images,) as the file's header says (before its EXIF orientation is applied)
    heights: np.ndarray
    embeddings: np.ndarray  # (<= EMBEDDING_SAMPLE, records.EMBEDDING_SIZE)
    source: dict  # the validation set: root, content_hash, images in it; and the weights' sha256

    @property
    def images(self) -> int:
        return len(self.confidences)

    def summary(self) -> dict:
        quantiles = {name: np.quantile(getattr(self, name), [0, 0.5, 1]).tolist() for name in _ARRAYS[:3]}
        return {
            "classes": self.classes,
            "images": self.images,
            "predicted": self.predicted,
            "modes": self.modes,
            "orientations": self.orientations,
            "quantiles (min, median, max)": quantiles,
            "embeddings": list(self.embeddings.shape),
            "source": self.source,
        }

    def save(self, folder: str | Path) -> list[Path]:
        """``reference.npz`` then ``reference.json`` (naming the arrays' sha256) into ``folder``; their paths."""
        folder = Path(folder)
        arrays, record = folder / REFERENCE_ARRAYS, folder / REFERENCE_FILE
        with atomic_write(arrays, "wb") as handle:
            np.savez(handle, **{name: getattr(self, name) for name in _ARRAYS})
        summary = {**self.summary(), "arrays_sha256": sha256_file(arrays)}
        with atomic_write(record, "w") as handle:
            json.dump(summary, handle, indent=2)
        return [arrays, record]


def parse_reference(record: bytes, arrays: bytes, where: str) -> Reference:
    """The two files' contents as a Reference; one line naming ``where`` when they do not belong together."""
    try:
        summary = json.loads(record)
        if summary["arrays_sha256"] != hashlib.sha256(arrays).hexdigest():
            raise ValueError(f"{REFERENCE_ARRAYS} is not the one {REFERENCE_FILE} names")
        with np.load(io.BytesIO(arrays)) as loaded:
            found = {name: loaded[name] for name in _ARRAYS}
        keys = ("classes", "predicted", "modes", "orientations", "source")
        return Reference(**{key: summary[key] for key in keys}, **found)
    except (ValueError, KeyError, OSError) as error:
        raise CorruptRegistryRecordError(f"{where}: the reference cannot be read ({error}): compute it again") from None


def _sample(count: int, size: int, seed: int) -> np.ndarray:
    """``size`` of ``count`` rows, seeded, in order (all of them when there are fewer)."""
    if count <= size:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, size, replace=False))


def compute_reference(model: LoadedModel, validation: ImageDirectory, seed: int = 0) -> Reference:
    """``model`` over a seeded sample of ``validation``: predictions, confidences, embeddings from one pass each
    batch; the image properties from the index."""
    if not len(validation):
        raise PipelineInputError(f"{validation.root} holds no images: a reference needs the validation images")
    rows = _sample(len(validation), REFERENCE_IMAGES, seed)
    samples, index = validation.samples(), validation.index
    predicted, confidences, embeddings = np.zeros(len(model.classes), int), [], []
    for start in range(0, len(rows), _BATCH):
        batch = [model.decode(samples[int(i)][0]) for i in rows[start : start + _BATCH]]
        outputs = model.outputs(batch)
        probabilities = probabilities_of(outputs).float().cpu().numpy()
        predicted += np.bincount(probabilities.argmax(axis=1), minlength=len(model.classes))
        confidences.append(probabilities.max(axis=1))
        embeddings.append(project(outputs.embeddings.float().cpu().numpy()))
    orientations = index.orientation[rows].astype(int)
    for position in np.flatnonzero(orientations == 0):  # an index written before orientations were recorded
        orientations[position] = image_properties(samples[int(rows[position])][0])["orientation"]
    widths, heights = index.width[rows].astype(int), index.height[rows].astype(int)
    turned = orientations >= 5  # stored upright: a request's header still has the sides of the sideways photo
    widths[turned], heights[turned] = heights[turned], widths[turned]
    kept = _sample(len(rows), EMBEDDING_SAMPLE, seed + 1)
    return Reference(
        classes=list(model.classes),
        predicted=dict(zip(model.classes, predicted.tolist(), strict=True)),
        modes=dict(Counter(mode.decode() for mode in index.mode[rows])),
        orientations={str(k): v for k, v in sorted(Counter(orientations.tolist()).items())},
        confidences=np.concatenate(confidences).astype(np.float32),
        widths=widths,
        heights=heights,
        embeddings=np.concatenate(embeddings)[kept],
        source={
            "validation": str(validation.root),
            "content_hash": validation.content_hash,
            "validation_images": len(validation),
            "weights_sha256": sha256_file(model.model_dir.weights_path),
        },
    )


def version_reference(
    registry: Registry, reference: str, validation: str | None = None
) -> tuple[Reference, Registration]:
    """The reference of the version ``reference`` resolves to, and its registration: the one registered with it
    (checked against its sha256), else the one stored beside it for these weights, else computed now from
    ``validation`` (its validation ImageDirectory) and stored beside it."""
    backend = backend_of(registry)
    registration = resolve(backend, reference)
    name, version = registration.name, registration.version
    where = f"{backend.location}/{version_key(name, version)}"
    found = {file: backend.read(version_key(name, version, file)) for file in (REFERENCE_FILE, REFERENCE_ARRAYS)}
    if REFERENCE_FILE in registration.files:
        digests = {f: hashlib.sha256(data).hexdigest() if data is not None else None for f, data in found.items()}
        wrong = [f for f, digest in digests.items() if digest != registration.files.get(f)]
        if wrong:
            raise CorruptRegistryRecordError(f"{where}: {', '.join(wrong)} differ from what was registered")
        return parse_reference(found[REFERENCE_FILE], found[REFERENCE_ARRAYS], where), registration
    if None not in found.values():
        kept = parse_reference(found[REFERENCE_FILE], found[REFERENCE_ARRAYS], where)
        if kept.source.get("weights_sha256") == registration.files[WEIGHTS_FILE]:
            return kept, registration
    if validation is None:
        registered = registration.datasets.get("validation")
        hint = f" (it was trained with {registered.source})" if registered else ""
        raise PipelineInputError(
            f"{name}/{version} was registered before references were kept: give its validation ImageDirectory "
            f"(--validation DIR){hint} once, and its reference is computed and kept beside it"
        )
    model = LoadedModel.load(f"{name}/{version}", registry)
    computed = compute_reference(model, ImageDirectory(validation))
    with tempfile.TemporaryDirectory(prefix="reference-") as scratch:
        for path in computed.save(scratch):
            backend.upload(version_key(name, version, path.name), path)
    logger.info("reference of %s/%s computed from %s and kept beside it", name, version, validation)
    return computed, registration
