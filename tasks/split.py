"""Split Image Directory: one labeled ImageDirectory becomes two (e.g. training and validation images).

Guarantees: ``fraction`` of each class's distinct images goes to the first side (rounded, seeded, stratified per
class), every class keeps at least one image on each side, and images with the same content (sha256) always land
on the same side, so no copy of a validation image is trained on. A class with fewer than two distinct images
cannot be split and raises ``ClassTooSmallToSplitError``.

Each side is an ordinary ImageDirectory: the source's class folders and file names, each file hard-linked (a copy
on another filesystem), and a manifest whose ``split`` record names the source, its ``content_hash``, the fraction,
the seed and the side. The source's quarantine and conversion warnings stay in the source's manifest (summing both
sides would count them twice). The source is only read; each side replaces its output only once both are complete,
and a rerun with the same source and settings returns the existing sides as they are.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import numpy as np

from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory, ImageDirectoryManifest, SplitRecord
from tasks.contracts.image_index import ImageIndex
from tasks.errors import ClassTooSmallToSplitError, InvalidDatasetError, NotLabeledDatasetError, PipelineInputError
from tasks.local_files import staged_directory

SIDES = ("first", "second")


def check_fraction(fraction: float, name: str = "fraction") -> None:
    if not 0 < fraction < 1:
        raise PipelineInputError(f"{name} {fraction!r} is not allowed: give a share strictly between 0 and 1, e.g. 0.2")


class Groups:
    """The images of an index grouped by content (sha256): a group is never split. Groups are numbered in path
    order of their first image, and each group's images are in path order, so the split does not depend on the
    index's order: the same content_hash, the same split."""

    def __init__(self, index: ImageIndex) -> None:
        self.index = index
        order = index.path.sorted_order()
        digests = np.ascontiguousarray(index.sha256[order]).view("S32").ravel()
        _, first, inverse = np.unique(digests, return_index=True, return_inverse=True)
        # Number the groups by their first image in path order.
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        self.of_image = np.empty(len(order), dtype=np.int64)  # the group of each image (index order)
        self.of_image[order] = rank[inverse.ravel()]
        self.first_image = order[np.sort(first)]  # each group's first image (path order), by group number
        self.sizes = np.bincount(self.of_image, minlength=len(first))

    def __len__(self) -> int:
        return len(self.sizes)

    def members(self, group: int) -> np.ndarray:
        """The images of ``group``, in path order."""
        images = np.flatnonzero(self.of_image == group)
        return images[self.index.path.take(images).sorted_order()]

    def shared(self) -> list[int]:
        """The groups of more than one image."""
        return np.flatnonzero(self.sizes > 1).tolist()

    def mixed(self) -> list[int]:
        """Groups of identical images that carry different labels."""
        labels = self.index.label
        first_label = labels[self.first_image][self.of_image]
        return np.unique(self.of_image[labels != first_label]).tolist()

    def describe(self, group: int, classes: list[str]) -> str:
        return " = ".join(
            f"{self.index.path[i]!r} ({classes[self.index.label[i]]})" for i in self.members(group).tolist()
        )


def plan_split(
    directory: ImageDirectory, fraction: float, seed: int, where: str = "the source"
) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the images of the first and the second side, each in the index's order.

    A group of identical images is stratified by the label of its first image (in path order) and moved whole.
    """
    check_fraction(fraction)
    manifest = directory.manifest
    if not manifest.labeled:
        raise NotLabeledDatasetError(
            f"{where} is not labeled: splitting keeps every class on both sides, so it needs class folders or a labels file"
        )
    groups = Groups(directory.index)
    group_class = directory.index.label[groups.first_image]
    by_class = [np.flatnonzero(group_class == c) for c in range(len(manifest.classes))]
    if too_small := {c: len(g) for c, g in zip(manifest.classes, by_class) if len(g) < 2}:
        found = ", ".join(
            f"{c!r} ({manifest.counts[c]} images, {distinct} distinct)"
            if manifest.counts[c] != distinct
            else f"{c!r} ({distinct} image{'s' * (distinct != 1)})"
            for c, distinct in too_small.items()
        )
        raise ClassTooSmallToSplitError(
            f"cannot split {where} with at least one image of every class on each side: a class needs at least 2 "
            f"distinct images (identical ones stay together); too few: {found}. Add images to these classes "
            "or remove them, or give validation images separately (validation_data)"
        )
    # scikit-learn's stratified splits (train_test_split, StratifiedShuffleSplit) share out the rounding across
    # classes by the overall size, so small classes can get no image on one side (5 classes of 100 and 5 of 3 at
    # test_size=0.05: four of the small ones get none). The counts are set per class here; a seeded
    # permutation picks which groups.
    rng = np.random.default_rng(seed)
    chosen = np.zeros(len(groups), dtype=bool)
    for class_groups in by_class:
        keep = min(max(math.floor(fraction * len(class_groups) + 0.5), 1), len(class_groups) - 1)
        chosen[class_groups[rng.permutation(len(class_groups))[:keep]]] = True
    first = chosen[groups.of_image]
    return np.flatnonzero(first), np.flatnonzero(~first)


def _contains(outer: Path, inner: Path) -> bool:
    return outer == inner or outer in inner.parents


def _check_locations(source: Path, outputs: tuple[Path, Path]) -> None:
    if _contains(*outputs) or _contains(*reversed(outputs)):
        raise InvalidDatasetError(f"the split's outputs {outputs[0]} and {outputs[1]} must not contain each other")
    for output in outputs:
        if _contains(output, source) or _contains(source, output):
            raise InvalidDatasetError(f"output {output} and the source {source} must not contain each other")
        if output.exists() and not output.is_dir():
            raise InvalidDatasetError(f"output {output} is an existing file, not a folder: give a new or empty folder")
        if output.exists() and any(output.iterdir()) and not (output / MANIFEST_NAME).is_file():
            raise InvalidDatasetError(
                f"output {output} exists and is not an ImageDirectory: choose an empty or new folder"
            )


def _link_or_copy(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, destination)


def _side_manifest(
    source: ImageDirectoryManifest, index: ImageIndex, record: SplitRecord, warnings: list[str]
) -> ImageDirectoryManifest:
    counts = np.bincount(index.label, minlength=len(source.classes))
    return ImageDirectoryManifest(
        labeled=True,
        classes=source.classes,
        counts={c: int(n) for c, n in zip(source.classes, counts)},
        source=source.source,
        class_folders=source.class_folders,
        labels_source=source.labels_source,
        normalisation=source.normalisation,
        warnings=warnings,
        split=record,
    )


def _previous(outputs: tuple[Path, Path], records: list[SplitRecord]) -> tuple[ImageDirectory, ImageDirectory] | None:
    try:
        sides = ImageDirectory(outputs[0]), ImageDirectory(outputs[1])
    except (InvalidDatasetError, ValueError):
        return None
    return sides if all(d.manifest.split == r for d, r in zip(sides, records)) else None


def split_image_directory(
    source: ImageDirectory | str | os.PathLike[str],
    first_output: str | os.PathLike[str],
    second_output: str | os.PathLike[str],
    fraction: float,
    seed: int = 1,
) -> tuple[ImageDirectory, ImageDirectory]:
    """Split ``source`` into two ImageDirectories: ``fraction`` of each class's distinct images in the first."""
    source = source if isinstance(source, ImageDirectory) else ImageDirectory(source)
    outputs = Path(first_output).resolve(), Path(second_output).resolve()
    _check_locations(source.root.resolve(), outputs)
    manifest = source.manifest
    sides = plan_split(source, fraction, seed, where=str(source.root))
    records = [
        SplitRecord(
            source=str(source.root.resolve()),
            source_content_hash=manifest.content_hash,
            fraction=fraction,
            seed=seed,
            side=side,
        )
        for side in SIDES
    ]
    if (previous := _previous(outputs, records)) is not None:
        return previous
    groups = Groups(source.index)
    mixed = groups.mixed()
    warnings = (
        [
            f"{len(mixed)} groups of identical images carry different labels, each group kept on one side: "
            + "; ".join(groups.describe(g, manifest.classes) for g in mixed[:5])
        ]
        if mixed
        else []
    )
    # Nested: the second side is renamed into place first, but neither unless both were filled.
    with staged_directory(outputs[0]) as first_staging, staged_directory(outputs[1]) as second_staging:
        for staging, rows, record in zip((first_staging, second_staging), sides, records):
            index = source.index.take(rows)
            for path in index.path:
                _link_or_copy(source.root / path, staging / path)
            ImageDirectory.write(staging, _side_manifest(manifest, index, record, warnings), index)
    return ImageDirectory(outputs[0]), ImageDirectory(outputs[1])


def split_markdown(source: ImageDirectory, first: ImageDirectory, second: ImageDirectory) -> str:
    """The ``split`` artifact: settings, images per class on each side, identical images kept together."""
    record, names = first.manifest.split, (first.root.name, second.root.name)
    groups = Groups(source.index)
    shared = groups.shared()
    rows = "".join(
        f"| {c} | {source.manifest.counts[c]} | {first.manifest.counts[c]} | {second.manifest.counts[c]} |\n"
        for c in source.classes
    )
    duplicates = (
        f"Identical images: {len(shared)} groups ({int(groups.sizes[shared].sum())} images), each kept on one side"
        if shared
        else "Identical images: none"
    )
    mixed = groups.mixed()
    return (
        f"### Split of {source.root}\n\n"
        f"{len(source)} images: {len(first)} to {names[0]}, {len(second)} to {names[1]}; "
        f"{record.fraction:g} of each class's distinct images to {names[0]}, seed {record.seed}, "
        f"source content hash `{record.source_content_hash[:12]}`.\n\n"
        f"| class | source | {names[0]} | {names[1]} |\n|---|---|---|---|\n{rows}\n"
        f"{duplicates}." + (f" {len(mixed)} of these groups carry different labels." if mixed else "") + "\n"
    )


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402

from tasks.retrying import stage_task  # noqa: E402


@stage_task("split")
def split(source: str, first_output: str, second_output: str, fraction: float, seed: int = 1) -> tuple[str, str]:
    """``split_image_directory``; artifact ``split``: images per class on each side, identical images, settings."""
    source_dir = ImageDirectory(source)
    first, second = split_image_directory(source_dir, first_output, second_output, fraction, seed)
    create_markdown_artifact(
        key="split",
        markdown=split_markdown(source_dir, first, second),
        description=f"{len(first)} + {len(second)} images split from {source}",
    )
    for warning in first.manifest.warnings:
        get_run_logger().warning("split: %s", warning)
    return str(first.root), str(second.root)
