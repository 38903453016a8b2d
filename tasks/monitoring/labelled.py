"""A labelled batch joins the training images: the class-per-folder folder a person made of the labelling queue
(label_queue.py writes a folder per predicted class; each wrong image moved into its right one), converted like any
source, then added to the training ImageDirectory only. An image whose content (sha256) is already among the
training or validation images is skipped and counted, so a batch never leaks a validation image into training; an
image twice in the batch under one class is taken once; one image under two classes is a LabelConflictError naming
both paths; a class the training data lacks is one line naming the folder and the classes allowed.

    image-classifier train --labelled-data to-label        # flows/pipeline.py's labelled_data

Nothing the user gave is changed: the training images and the batch's are hard-linked (copied across filesystems)
into a new ImageDirectory in the run's folder. Imports no Prefect, no torch."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tasks.contracts.image_directory import (
    IMAGE_EXTENSIONS,
    INDEX_NAME,
    LABELLED_FOLDER,
    ImageDirectory,
    class_folders,
)
from tasks.contracts.image_index import ImageIndex
from tasks.contracts.index_writer import IndexWriter
from tasks.errors import InvalidDatasetError, LabelConflictError
from tasks.storage.local_files import link_or_copy, staged_directory
from tasks.storage.s3 import existing_local_path


@dataclass
class LabelledBatch:
    """What a labelled batch added to the training images, per class."""

    folder: str  # as the user gave it
    classes: list[str]
    added: dict[str, int]
    in_train: dict[str, int]  # skipped: the same content is a training image already
    in_validation: dict[str, int]  # skipped: the same content is a validation image (it would leak)
    repeated: dict[str, int]  # the same content twice in the batch, under one class: taken once
    train_images: int  # the training images with the batch's

    def headline(self) -> str:
        skipped = sum(self.in_train.values()) + sum(self.in_validation.values())
        return (
            f"{sum(self.added.values())} labelled images from {self.folder} added to the training images "
            f"({self.train_images} now); {skipped} skipped as already in train or validation"
            + (f", {sum(self.repeated.values())} repeated in the batch" if any(self.repeated.values()) else "")
        )

    def rows(self) -> list[dict]:
        """The per-class table of the run's artifact."""
        return [
            {
                "class": c,
                "added": self.added[c],
                "already in train": self.in_train[c],
                "already in validation": self.in_validation[c],
                "repeated in the batch": self.repeated[c],
            }
            for c in self.classes
        ]

    def payload(self) -> dict:
        """What the event ``image-classifier.data.labelled`` carries: ``labelled_data`` is the folder (the training
        deployment's parameter of that name, for the automation that runs it on the event)."""
        return {"labelled_data": self.folder, **{k: v for k, v in asdict(self).items() if k != "folder"}}


def conflict(found: list[tuple[str, str, str]]) -> None:
    """``found``: (sha256, class, path) of each image of a batch; the first content under two classes is a
    LabelConflictError naming both paths."""
    first: dict[str, tuple[str, str]] = {}
    for digest, label, path in found:
        seen = first.setdefault(digest, (label, path))
        if seen[0] != label:
            raise LabelConflictError(
                f"one image under two classes in the labelled data: {seen[1]} ({seen[0]}) and {path} ({label}) "
                f"have the same content (sha256 {digest[:12]}…): keep it in its right class folder only"
            )


def unknown_classes(folder: str, labelled: set[str], allowed: set[str]) -> None:
    """A class of the batch that the training data lacks: one line naming the folder and the allowed classes."""
    if extra := sorted(labelled - allowed):
        raise InvalidDatasetError(
            f"{folder}: class folder{'s' * (len(extra) > 1)} {', '.join(extra)} not among the training data's "
            f"classes ({', '.join(sorted(allowed))}): move its images into one of these, or add the class to the "
            "training and validation data"
        )


def check_labelled_folder(location: str, classes: set[str] | None = None) -> None:
    """Before any work, a local folder (an archive or S3 prefix is left to the stage): it exists, its class folders
    are among ``classes`` (when known), and no content is under two classes (every image read once: a labelling
    queue is a few hundred)."""
    give = "give the folder of class folders the labelling queue became (label-queue --out)"
    root = existing_local_path(location, "the labelled data", give)
    if root is None or not root.is_dir():
        return  # remote, or an archive: the convert stage opens it
    folders = _class_folders(root)
    if classes is not None:
        unknown_classes(location, {folder.name for folder in folders}, classes)
    found = []
    for folder in folders:
        for directory, subfolders, files in os.walk(folder):
            subfolders[:] = sorted(s for s in subfolders if not s.startswith("."))
            for name in sorted(files):
                if _is_image(path := Path(directory) / name):
                    found.append((hashlib.sha256(path.read_bytes()).hexdigest(), folder.name, str(path)))
    conflict(found)


def _is_image(path: Path) -> bool:
    return path.is_file() and not path.name.startswith(".") and path.suffix.lower() in IMAGE_EXTENSIONS


def _class_folders(root: Path) -> list[Path]:
    """The class folders below ``root``, through folders that only wrap one (``export/to-label/<class>``), as the
    convert stage finds them."""
    while True:
        entries = [p for p in root.iterdir() if not p.name.startswith(".")]
        folders = sorted(p for p in entries if p.is_dir())
        if len(folders) != 1 or any(map(_is_image, entries)) or any(map(_is_image, folders[0].iterdir())):
            return folders
        root = folders[0]


def _digests(index: ImageIndex) -> np.ndarray:
    return np.ascontiguousarray(index.sha256).view("S32").ravel()


def add_labelled(
    train: ImageDirectory, validation: ImageDirectory, labelled: ImageDirectory, output: str | Path, folder: str
) -> tuple[ImageDirectory, LabelledBatch]:
    """``train`` with the images of ``labelled`` (converted from the user's ``folder``) that are neither training
    nor validation images, as a new ImageDirectory at ``output``; what was added and skipped, per class."""
    classes, index = train.classes, labelled.index
    named = [labelled.classes[label] for label in index.label.tolist()]
    paths = [os.path.join(folder, index.source_path[i] or index.path[i]) for i in range(len(index))]
    conflict([(index.sha256[i].tobytes().hex(), named[i], paths[i]) for i in range(len(index))])
    unknown_classes(folder, set(labelled.classes), set(classes))
    digests = _digests(index)
    in_train = np.isin(digests, _digests(train.index))
    in_validation = np.isin(digests, _digests(validation.index)) & ~in_train
    _, first = np.unique(digests, return_index=True)
    repeated = np.ones(len(index), dtype=bool)
    repeated[first] = False
    repeated &= ~(in_train | in_validation)
    new = ~(in_train | in_validation | repeated)

    def per_class(mask: np.ndarray) -> dict[str, int]:
        counted = Counter(named[i] for i in np.flatnonzero(mask))
        return {c: counted.get(c, 0) for c in classes}

    position, folders = {c: i for i, c in enumerate(classes)}, train.manifest.class_folders or class_folders(classes)
    batch_folder = LABELLED_FOLDER + labelled.content_hash[:12]
    added = []
    for i in np.flatnonzero(new).tolist():
        row = index.row(i)
        inside = row.path.split("/", 1)[-1]  # below its class folder
        path = f"{folders[named[i]]}/{batch_folder}/{inside}"
        added.append((row._replace(path=path, label=position[named[i]]), labelled.root / row.path))
    counts = Counter(row.label for row, _ in added)
    manifest = train.manifest.model_copy(
        update={"counts": {c: train.manifest.counts.get(c, 0) + counts.get(i, 0) for i, c in enumerate(classes)}}
    )
    with staged_directory(output) as staging:
        for path in train.index.path:
            link_or_copy(train.root / path, staging / path)
        for row, source in added:
            link_or_copy(source, staging / row.path)
        writer = IndexWriter(staging / INDEX_NAME)
        for i in range(len(train)):
            writer.append(train.index.row(i))
        for row, _ in added:
            writer.append(row)
        ImageDirectory.write(staging, manifest, writer)
    merged = ImageDirectory(output)
    return merged, LabelledBatch(
        folder=folder,
        classes=classes,
        added=per_class(new),
        in_train=per_class(in_train),
        in_validation=per_class(in_validation),
        repeated=per_class(repeated),
        train_images=len(merged),
    )
