"""Label validation: refuse training data a classifier cannot be trained on, before anything launches.

Refused (typed errors, never retried): unlabeled sets, different class sets, fewer than two classes, a
training class with fewer than ``min_images_per_class`` images. Reported: the imbalance ratio, images that are
in both sets (same sha256) and training images with a near-duplicate in validation (perceptual hashes within
``near_duplicate_distance`` bits: a resized or re-compressed copy, a shot of the same burst), which make
validation figures look better than they are.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, Field, computed_field

from tasks.contracts.image_directory import ImageDirectory
from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.near_duplicates import DEFAULT_DISTANCE, check_distance, hamming, near_pairs

DEFAULT_MIN_IMAGES_PER_CLASS = 2
_EXAMPLES = 5


class LabelReport(BaseModel):
    classes: list[str]
    train_counts: dict[str, int]
    validation_counts: dict[str, int]
    quarantined: int
    leaked_counts: dict[str, int] = Field(
        {}, description="per class: training images whose exact bytes are also in the validation set"
    )
    leaked_examples: list[tuple[str, str]] = Field([], description="a few (training path, validation path) pairs")
    near_duplicate_distance: int = Field(DEFAULT_DISTANCE, description="perceptual-hash bits; -1: not looked for")
    near_duplicate_counts: dict[str, int] = Field(
        {}, description="per class: training images (not exact copies) with a near-duplicate in validation"
    )
    near_duplicate_examples: list[tuple[str, str, int]] = Field(
        [], description="a few (training path, validation path, differing bits of 64)"
    )

    @computed_field
    @property
    def imbalance_ratio(self) -> float:
        """Largest over smallest training class."""
        return max(self.train_counts.values()) / min(self.train_counts.values())

    @property
    def leaked(self) -> int:
        return sum(self.leaked_counts.values())

    @property
    def near_duplicates(self) -> int:
        return sum(self.near_duplicate_counts.values())


def differing_classes_message(train_classes: set[str], validation_classes: set[str]) -> str:
    only_train = sorted(train_classes - validation_classes)
    only_val = sorted(validation_classes - train_classes)
    return (
        "training and validation classes differ: "
        f"only in training {only_train or 'none'}, only in validation {only_val or 'none'}: "
        "add the missing classes' images, or remove the extra classes, so both sets have the same classes"
    )


def find_leakage(train: ImageDirectory, validation: ImageDirectory) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Training images whose content (sha256) is also in validation: per-class counts and a few examples."""
    train_digests, val_digests = (np.ascontiguousarray(d.index.sha256).view("S32").ravel() for d in (train, validation))
    leaked = np.flatnonzero(np.isin(train_digests, val_digests))
    counts = np.bincount(train.index.label[leaked], minlength=len(train.classes))
    examples = []
    for i in leaked[:_EXAMPLES].tolist():
        match = int(np.flatnonzero(val_digests == train_digests[i])[0])
        examples.append((train.index.path[i], validation.index.path[match]))
    return {c: int(n) for c, n in zip(train.classes, counts) if n}, examples


def find_near_duplicates(
    train: ImageDirectory, validation: ImageDirectory, distance: int
) -> tuple[dict[str, int], list[tuple[str, str, int]]]:
    """Training images that are not exact copies of a validation image but whose perceptual hash is within
    ``distance`` bits of one's: per-class counts and a few (training path, validation path, bits) examples."""
    hashes = [np.asarray(d.index.perceptual_hash) for d in (train, validation)]
    pairs = near_pairs(np.concatenate(hashes), distance)
    pairs = pairs[(pairs[:, 0] < len(train)) & (pairs[:, 1] >= len(train))]
    t, v = pairs[:, 0], pairs[:, 1] - len(train)
    differ = np.any(train.index.sha256[t] != validation.index.sha256[v], axis=1)  # exact copies: find_leakage
    t, v = t[differ], v[differ]
    images = np.unique(t)
    counts = np.bincount(train.index.label[images], minlength=len(train.classes))
    examples = [
        (train.index.path[i], validation.index.path[j], int(hamming(hashes[0][i], hashes[1][j])))
        for i, j in zip(t[:_EXAMPLES].tolist(), v[:_EXAMPLES].tolist())
    ]
    return {c: int(n) for c, n in zip(train.classes, counts) if n}, examples


def check_training_data(
    train: ImageDirectory,
    validation: ImageDirectory,
    min_images_per_class: int = DEFAULT_MIN_IMAGES_PER_CLASS,
    near_duplicate_distance: int = DEFAULT_DISTANCE,
) -> LabelReport:
    """Both sets labeled, with the same classes (at least two, each with enough training images).

    Raises the typed errors otherwise; leakage and imbalance are reported, not refused.
    """
    check_distance(near_duplicate_distance)
    for role, data in (("training", train), ("validation", validation)):
        if not data.labeled:
            raise NotLabeledDatasetError(
                f"the {role} data at {data.root} is not labeled: put each class's images in a folder "
                f"named after the class (e.g. {data.root.name}/cat/1.jpg, {data.root.name}/dog/2.jpg)"
            )
    train_classes, val_classes = set(train.classes), set(validation.classes)
    if train_classes != val_classes:
        raise InvalidDatasetError(differing_classes_message(train_classes, val_classes))
    if len(train_classes) < 2:
        raise InvalidDatasetError(
            f"the training data at {train.root} has {len(train_classes)} class {sorted(train_classes)}: "
            "a classifier needs at least two class folders"
        )
    too_few = {c: n for c, n in train.manifest.counts.items() if n < min_images_per_class}
    if too_few:
        found = ", ".join(f"{c!r} has {n}" for c, n in sorted(too_few.items()))
        raise InvalidDatasetError(
            f"training classes with fewer than {min_images_per_class} images (min_images_per_class): {found}; "
            "add images to these classes or remove them from both sets"
        )
    leaked_counts, leaked_examples = find_leakage(train, validation)
    near_counts, near_examples = find_near_duplicates(train, validation, near_duplicate_distance)
    return LabelReport(
        classes=train.classes,
        train_counts=dict(train.manifest.counts),
        validation_counts=dict(validation.manifest.counts),
        quarantined=len(train.manifest.quarantined) + len(validation.manifest.quarantined),
        leaked_counts=leaked_counts,
        leaked_examples=leaked_examples,
        near_duplicate_distance=near_duplicate_distance,
        near_duplicate_counts=near_counts,
        near_duplicate_examples=near_examples,
    )
