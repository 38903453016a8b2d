"""The Prefect tasks of the data stage: ``resolve_sources`` (the training and validation sources, given or the
bundled digits), ``split`` (artifact ``split``) and ``validate_labels`` (artifact ``label-validation``), around
the plain functions of ``datasets``, ``split`` and ``validate``, which import no Prefect."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tasks.contracts.image_directory import ImageDirectory
from tasks.data.datasets import given_or_default_sources
from tasks.data.split import Groups, split_image_directory, split_markdown
from tasks.data.validate import DEFAULT_MIN_IMAGES_PER_CLASS, LabelReport, check_training_data
from tasks.near_duplicates import DEFAULT_DISTANCE
from tasks.retrying import stage_task


@stage_task(retries=0)
def resolve_sources(
    train: str | None, validation: str | None, default_root: str, validation_fraction: float | None = None
) -> tuple[str, str | None]:
    return given_or_default_sources(train, validation, default_root, validation_fraction)


@stage_task
def split(
    source: str,
    first_output: str,
    second_output: str,
    fraction: float,
    seed: int = 1,
    near_duplicate_distance: int = DEFAULT_DISTANCE,
) -> tuple[str, str]:
    """``split_image_directory``; artifact ``split``: images per class on each side, identical and near-duplicate
    images, settings."""
    source_dir = ImageDirectory(source)
    groups = Groups(source_dir.index, near_duplicate_distance)  # once: the near-duplicate lookup is the costly part
    first, second = split_image_directory(
        source_dir, first_output, second_output, fraction, seed, near_duplicate_distance, groups
    )
    create_markdown_artifact(
        key="split",
        markdown=split_markdown(source_dir, first, second, groups),
        description=f"{len(first)} + {len(second)} images split from {source}",
    )
    for warning in first.manifest.warnings:
        get_run_logger().warning("split: %s", warning)
    return str(first.root), str(second.root)


@stage_task(retries=0)
def validate_labels(
    train: str,
    validation: str,
    min_images_per_class: int = DEFAULT_MIN_IMAGES_PER_CLASS,
    near_duplicate_distance: int = DEFAULT_DISTANCE,
) -> LabelReport:
    """Deterministic: never retried. Artifact ``label-validation``: images per class, leakage (identical and
    near-duplicate images in both sets), imbalance."""
    report = check_training_data(
        ImageDirectory(train), ImageDirectory(validation), min_images_per_class, near_duplicate_distance
    )
    leakage = (
        f"{report.leaked} training images are also in validation (same bytes)"
        if report.leaked
        else "no images in both sets"
    )
    near = (
        f"{report.near_duplicates} training images have a near-duplicate in validation (perceptual hashes within "
        f"{report.near_duplicate_distance} of 64 bits: a resized or re-compressed copy, or a shot of the same burst)"
        if report.near_duplicates
        else ""
    )
    examples = "".join(f"\n- `{t}` = `{v}`" for t, v in report.leaked_examples)
    examples += "".join(f"\n- `{t}` ~ `{v}` ({bits} bits apart)" for t, v, bits in report.near_duplicate_examples)
    create_table_artifact(
        key="label-validation",
        table=[
            {
                "class": c,
                "train": report.train_counts[c],
                "validation": report.validation_counts[c],
                "in both sets": report.leaked_counts.get(c, 0),
                "near-duplicates in both sets": report.near_duplicate_counts.get(c, 0),
            }
            for c in report.classes
        ],
        description=f"{len(report.classes)} classes; imbalance (largest/smallest training class) "
        f"{report.imbalance_ratio:.2f}; {leakage}{'; ' + near if near else ''}{examples}\n\n"
        f"{report.quarantined} files quarantined",
    )
    logger = get_run_logger()
    if report.leaked:
        logger.warning("%s: validation figures will look better than they are", leakage)
    if near:
        shown = "; ".join(f"{t!r} ~ {v!r}" for t, v, _ in report.near_duplicate_examples[:3])
        logger.warning("%s, e.g. %s: validation figures will look better than they are", near, shown)
    logger.info("labels valid: %d classes, imbalance ratio %.2f", len(report.classes), report.imbalance_ratio)
    return report
