"""Split Image Directory: one labeled ImageDirectory becomes two (e.g. training and validation images).

Guarantees: ``fraction`` of each class's distinct images goes to the first side (rounded, seeded, stratified per
class), every class keeps at least one image on each side, and images with the same content (sha256) always land
on the same side, so no copy of a validation image is trained on. So do near-duplicates: images whose perceptual
hashes (stored at conversion) differ in at most ``near_duplicate_distance`` of 64 bits, such as a photo, its
resized and re-compressed copies and the shots of a burst, and whatever chains to them (``tasks.near_duplicates``).
A class with fewer than two distinct images (or groups) cannot be split and raises ``ClassTooSmallToSplitError``.

Each side is an ordinary ImageDirectory: the source's class folders and file names, each file hard-linked (a copy
on another filesystem), and a manifest whose ``split`` record names the source, its ``content_hash``, the fraction,
the seed and the side. The source's quarantine and conversion warnings stay in the source's manifest (summing both
sides would count them twice). The source is only read; each side replaces its output only once both are complete,
and a rerun with the same source and settings returns the existing sides as they are.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory, ImageDirectoryManifest, SplitRecord
from tasks.contracts.image_index import ImageIndex
from tasks.errors import ClassTooSmallToSplitError, InvalidDatasetError, NotLabeledDatasetError, PipelineInputError
from tasks.near_duplicates import DEFAULT_DISTANCE, check_distance, near_pairs
from tasks.storage.local_files import link_or_copy, staged_directory

SIDES = ("first", "second")


def check_fraction(fraction: float, name: str = "fraction") -> None:
    if not 0 < fraction < 1:
        raise PipelineInputError(f"{name} {fraction!r} is not allowed: give a share strictly between 0 and 1, e.g. 0.2")


class Groups:
    """The images of an index grouped by content (sha256) and, unless ``near_duplicate_distance`` is -1, by
    perceptual hash (within that many bits, chained): a group is never split. Groups are numbered in path order of
    their first image, and each group's images are in path order, so the split does not depend on the index's
    order: the same content_hash and distance, the same split."""

    def __init__(self, index: ImageIndex, near_duplicate_distance: int = DEFAULT_DISTANCE) -> None:
        check_distance(near_duplicate_distance)
        self.index = index
        order = index.path.sorted_order()
        digests = np.ascontiguousarray(index.sha256[order]).view("S32").ravel()
        _, first, content = np.unique(digests, return_index=True, return_inverse=True)
        content = content.ravel()  # each image's content (path order)
        # Each content's component: itself, or the near-duplicates it chains to (labels 0..k-1).
        component = np.arange(len(first))
        self.near = near_pairs(index.perceptual_hash[order[first]], near_duplicate_distance)  # contents' pairs
        if len(self.near):
            graph = coo_matrix((np.ones(len(self.near)), (self.near[:, 0], self.near[:, 1])), (len(first),) * 2)
            component = connected_components(graph, directed=False)[1]
        _, first, inverse = np.unique(component[content], return_index=True, return_inverse=True)
        # Number the groups by their first image in path order.
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        self.of_image = np.empty(len(order), dtype=np.int64)  # the group of each image (index order)
        self.of_image[order] = rank[inverse.ravel()]
        self.first_image = order[np.sort(first)]  # each group's first image (path order), by group number
        self.sizes = np.bincount(self.of_image, minlength=len(first))
        self.distinct = np.bincount(rank[component], minlength=len(first))  # distinct contents in each group

    def __len__(self) -> int:
        return len(self.sizes)

    def members(self, group: int) -> np.ndarray:
        """The images of ``group``, in path order."""
        images = np.flatnonzero(self.of_image == group)
        return images[self.index.path.take(images).sorted_order()]

    def shared(self) -> list[int]:
        """The groups of more than one image."""
        return np.flatnonzero(self.sizes > 1).tolist()

    def near_duplicate(self) -> list[int]:
        """The groups holding more than one distinct content: near-duplicates (and any copies of them)."""
        return np.flatnonzero(self.distinct > 1).tolist()

    def mixed(self) -> list[int]:
        """Groups of identical or near-duplicate images that carry different labels."""
        labels = self.index.label
        first_label = labels[self.first_image][self.of_image]
        return np.unique(self.of_image[labels != first_label]).tolist()

    def describe(self, group: int, classes: list[str], shown: int = 4) -> str:
        members = self.members(group).tolist()
        listed = " ~ ".join(f"{self.index.path[i]!r} ({classes[self.index.label[i]]})" for i in members[:shown])
        return listed + (f" and {len(members) - shown} more" if len(members) > shown else "")


def plan_split(
    directory: ImageDirectory,
    fraction: float,
    seed: int,
    where: str = "the source",
    near_duplicate_distance: int = DEFAULT_DISTANCE,
    groups: Groups | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the images of the first and the second side, each in the index's order.

    A group of identical or near-duplicate images is stratified by the label of its first image (in path order)
    and moved whole.
    """
    check_fraction(fraction)
    manifest = directory.manifest
    if not manifest.labeled:
        raise NotLabeledDatasetError(
            f"{where} is not labeled: splitting keeps every class on both sides, so it needs class folders or a labels file"
        )
    groups = groups if groups is not None else Groups(directory.index, near_duplicate_distance)
    group_class = directory.index.label[groups.first_image]
    by_class = [np.flatnonzero(group_class == c) for c in range(len(manifest.classes))]
    if too_small := {c: len(g) for c, g in zip(manifest.classes, by_class) if len(g) < 2}:
        found = ", ".join(
            f"{c!r} ({manifest.counts[c]} images, {distinct} distinct group{'s' * (distinct != 1)})"
            if manifest.counts[c] != distinct
            else f"{c!r} ({distinct} image{'s' * (distinct != 1)})"
            for c, distinct in too_small.items()
        )
        raise ClassTooSmallToSplitError(
            f"cannot split {where} with at least one image of every class on each side: a class needs at least 2 "
            f"distinct images (identical and near-duplicate ones stay together, near_duplicate_distance "
            f"{near_duplicate_distance}); too few: {found}. Add images to these classes or remove them, or give "
            "validation images separately (validation_data)"
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
    near_duplicate_distance: int = DEFAULT_DISTANCE,
    groups: Groups | None = None,
) -> tuple[ImageDirectory, ImageDirectory]:
    """Split ``source`` into two ImageDirectories: ``fraction`` of each class's distinct images in the first
    (``groups``: the source's, when the caller has them already)."""
    source = source if isinstance(source, ImageDirectory) else ImageDirectory(source)
    outputs = Path(first_output).resolve(), Path(second_output).resolve()
    _check_locations(source.root.resolve(), outputs)
    manifest = source.manifest
    groups = groups if groups is not None else Groups(source.index, near_duplicate_distance)
    sides = plan_split(source, fraction, seed, str(source.root), near_duplicate_distance, groups)
    records = [
        SplitRecord(
            source=str(source.root.resolve()),
            source_content_hash=manifest.content_hash,
            fraction=fraction,
            seed=seed,
            side=side,
            near_duplicate_distance=near_duplicate_distance,
        )
        for side in SIDES
    ]
    if (previous := _previous(outputs, records)) is not None:
        return previous
    warnings = group_warnings(groups, manifest.classes)
    # Nested: the second side is renamed into place first, but neither unless both were filled.
    with staged_directory(outputs[0]) as first_staging, staged_directory(outputs[1]) as second_staging:
        for staging, rows, record in zip((first_staging, second_staging), sides, records):
            index = source.index.take(rows)
            for path in index.path:
                link_or_copy(source.root / path, staging / path)
            ImageDirectory.write(staging, _side_manifest(manifest, index, record, warnings), index)
    return ImageDirectory(outputs[0]), ImageDirectory(outputs[1])


# A near-duplicate group this large (and over 1% of the images) is worth a look: chained false matches.
_LARGE_GROUP = 10


def group_warnings(groups: Groups, classes: list[str]) -> list[str]:
    """Groups whose images carry different labels, and near-duplicate groups large enough to be chained false
    matches: each kept on one side, said with examples."""
    warnings = []
    if mixed := groups.mixed():
        warnings.append(
            f"{len(mixed)} groups of identical or near-duplicate images carry different labels, each group kept on "
            "one side: " + "; ".join(groups.describe(g, classes) for g in mixed[:5])
        )
    limit = max(_LARGE_GROUP, len(groups.index) // 100)
    if large := [g for g in groups.near_duplicate() if groups.sizes[g] > limit]:
        largest = max(large, key=lambda g: groups.sizes[g])
        warnings.append(
            f"{len(large)} near-duplicate groups hold over {limit} images each (the largest "
            f"{int(groups.sizes[largest])}: {groups.describe(largest, classes)}); each is kept on one side. If "
            "these are not copies or bursts of one photo, lower near_duplicate_distance"
        )
    return warnings


def split_markdown(
    source: ImageDirectory, first: ImageDirectory, second: ImageDirectory, groups: Groups | None = None
) -> str:
    """The ``split`` artifact: settings, images per class on each side, identical and near-duplicate images kept
    together (``groups``: the source's as the split made them, when the caller has them)."""
    record, names = first.manifest.split, (first.root.name, second.root.name)
    distance = record.near_duplicate_distance if record.near_duplicate_distance is not None else -1
    groups = groups if groups is not None else Groups(source.index, distance)
    shared, near = groups.shared(), groups.near_duplicate()
    rows = "".join(
        f"| {c} | {source.manifest.counts[c]} | {first.manifest.counts[c]} | {second.manifest.counts[c]} |\n"
        for c in source.classes
    )
    duplicates = (
        f"Identical or near-duplicate images: {len(shared)} groups ({int(groups.sizes[shared].sum())} images), "
        "each kept on one side"
        if shared
        else "Identical or near-duplicate images: none"
    )
    hashed = int(np.count_nonzero(source.index.perceptual_hash))
    near_line = (
        f"Near-duplicates (perceptual hashes within {distance} of 64 bits; {hashed} of {len(source)} images hashed): "
        + (
            f"{len(near)} groups ({int(groups.sizes[near].sum())} images), e.g. "
            + "; ".join(groups.describe(g, source.classes) for g in near[:3])
            if near
            else "none"
        )
        + ".\n\n"
        if distance >= 0
        else "Near-duplicates: not looked for (near_duplicate_distance -1).\n\n"
    )
    mixed = groups.mixed()
    return (
        f"### Split of {source.root}\n\n"
        f"{len(source)} images: {len(first)} to {names[0]}, {len(second)} to {names[1]}; "
        f"{record.fraction:g} of each class's distinct images to {names[0]}, seed {record.seed}, "
        f"source content hash `{record.source_content_hash[:12]}`.\n\n"
        f"| class | source | {names[0]} | {names[1]} |\n|---|---|---|---|\n{rows}\n"
        f"{near_line}{duplicates}." + (f" {len(mixed)} of these groups carry different labels." if mixed else "") + "\n"
    )
