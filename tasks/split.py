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
from collections import Counter
from pathlib import Path

import numpy as np

from tasks.errors import ClassTooSmallToSplitError, InvalidDatasetError, NotLabeledDatasetError, PipelineInputError
from tasks.fileio import staged_directory
from tasks.image_directory import MANIFEST_NAME, ImageDirectory, ImageDirectoryManifest, ImageRecord, SplitRecord

SIDES = ("first", "second")


def check_fraction(fraction: float, name: str = "fraction") -> None:
    if not 0 < fraction < 1:
        raise PipelineInputError(f"{name} {fraction!r} is not allowed: give a share strictly between 0 and 1, e.g. 0.2")


def duplicate_groups(images: list[ImageRecord]) -> list[list[ImageRecord]]:
    """Images grouped by content (sha256), each group and the groups in path order: a group is never split.

    Path order makes the split independent of the manifest's order: the same content_hash, the same split.
    """
    groups: dict[str, list[ImageRecord]] = {}
    for record in sorted(images, key=lambda r: r.path):
        groups.setdefault(record.sha256, []).append(record)
    return list(groups.values())


def mixed_label_groups(groups: list[list[ImageRecord]]) -> list[list[ImageRecord]]:
    """Groups of identical images that carry different labels."""
    return [g for g in groups if len({r.label for r in g}) > 1]


def plan_split(
    manifest: ImageDirectoryManifest, fraction: float, seed: int, where: str = "the source"
) -> tuple[list[ImageRecord], list[ImageRecord]]:
    """The images of the first and the second side, each in the manifest's order.

    A group of identical images is stratified by the label of its first image (in path order) and moved whole.
    """
    check_fraction(fraction)
    if not manifest.labeled:
        raise NotLabeledDatasetError(
            f"{where} is not labeled: splitting keeps every class on both sides, so it needs class folders or a labels file"
        )
    by_class: dict[str, list[list[ImageRecord]]] = {c: [] for c in manifest.classes}
    for group in duplicate_groups(manifest.images):
        by_class[group[0].label].append(group)
    if too_small := {c: len(groups) for c, groups in by_class.items() if len(groups) < 2}:
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
    first: set[str] = set()
    for groups in by_class.values():
        keep = min(max(math.floor(fraction * len(groups) + 0.5), 1), len(groups) - 1)
        for i in rng.permutation(len(groups))[:keep]:
            first.update(r.path for r in groups[i])
    return (
        [r for r in manifest.images if r.path in first],
        [r for r in manifest.images if r.path not in first],
    )


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
    source: ImageDirectoryManifest, images: list[ImageRecord], record: SplitRecord, warnings: list[str]
) -> ImageDirectoryManifest:
    counts = Counter(r.label for r in images)
    return ImageDirectoryManifest(
        labeled=True,
        classes=source.classes,
        counts={c: counts[c] for c in source.classes},
        images=images,
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
    sides = plan_split(manifest, fraction, seed, where=str(source.root))
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
    mixed = mixed_label_groups(duplicate_groups(manifest.images))
    warnings = (
        [
            f"{len(mixed)} groups of identical images carry different labels, each group kept on one side: "
            + "; ".join(" = ".join(f"{r.path!r} ({r.label})" for r in g) for g in mixed[:5])
        ]
        if mixed
        else []
    )
    # Nested: the second side is renamed into place first, but neither unless both were filled.
    with staged_directory(outputs[0]) as first_staging, staged_directory(outputs[1]) as second_staging:
        for staging, images, record in zip((first_staging, second_staging), sides, records):
            for image in images:
                _link_or_copy(source.root / image.path, staging / image.path)
            ImageDirectory.write(staging, _side_manifest(manifest, images, record, warnings))
    return ImageDirectory(outputs[0]), ImageDirectory(outputs[1])


def split_markdown(source: ImageDirectory, first: ImageDirectory, second: ImageDirectory) -> str:
    """The ``split`` artifact: settings, images per class on each side, identical images kept together."""
    record, names = first.manifest.split, (first.root.name, second.root.name)
    groups = [g for g in duplicate_groups(source.manifest.images) if len(g) > 1]
    rows = "".join(
        f"| {c} | {source.manifest.counts[c]} | {first.manifest.counts[c]} | {second.manifest.counts[c]} |\n"
        for c in source.classes
    )
    duplicates = (
        f"Identical images: {len(groups)} groups ({sum(map(len, groups))} images), each kept on one side"
        if groups
        else "Identical images: none"
    )
    mixed = mixed_label_groups(groups)
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
