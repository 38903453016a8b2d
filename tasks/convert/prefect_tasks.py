"""The Prefect task of Convert to Image Directory: ``convert`` (artifacts ``<role>-images`` and
``<role>-quarantined``), around ``conversion.convert_to_image_directory``, which imports no Prefect."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact

from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.image_directory import Normalisation
from tasks.convert.conversion import convert_to_image_directory
from tasks.convert.labelling import SingleClass
from tasks.retrying import stage_task


@stage_task
def convert(
    source: str,
    output: str,
    role: str,
    labels: str | None = None,
    labeled: bool | None = None,
    normalisation: Normalisation | None = None,
    single_class: SingleClass = "labeled",
    limits: ConversionLimits = ConversionLimits(),
) -> str:
    """Convert ``source`` for ``role`` ('train', 'validation', 'score'); artifact ``<role>-images``.

    Quarantined files go to the ``<role>-quarantined`` table; S3 and network failures are retried,
    problems with the input are not.
    """
    image_dir = convert_to_image_directory(
        source,
        output,
        labels=labels,
        labeled=labeled,
        single_class=single_class,
        normalisation=normalisation,
        **limits.model_dump(),
    )
    manifest, logger = image_dir.manifest, get_run_logger()
    rows = [
        {"class": c, "folder": manifest.class_folders.get(c, c), "images": manifest.counts[c]} for c in manifest.classes
    ]
    create_table_artifact(
        key=f"{role}-images",
        table=rows or [{"class": "(unlabeled)", "folder": "", "images": len(image_dir)}],
        description=f"{role}: {len(image_dir)} images in {len(manifest.classes)} classes from {manifest.source}; "
        f"{len(manifest.quarantined)} quarantined" + "".join(f"\n\nWarning: {w}" for w in manifest.warnings),
    )
    if manifest.quarantined:
        create_table_artifact(
            key=f"{role}-quarantined",
            table=[q.model_dump() for q in manifest.quarantined],
            description=f"{role}: files left out of the ImageDirectory, with the reason",
        )
    for warning in manifest.warnings:
        logger.warning("%s: %s", role, warning)
    logger.info(
        "%s: %d images, %d classes, %d quarantined -> %s",
        role,
        len(image_dir),
        len(manifest.classes),
        len(manifest.quarantined),
        image_dir.root,
    )
    return str(image_dir.root)
