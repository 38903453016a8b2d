"""Convert to Image Directory: a folder, archive or S3 prefix of images becomes an ImageDirectory.

Sources (``tasks.sources``): a folder, a .zip/.tar/.tar.gz/.tgz/.tar.bz2/.tar.xz archive (or a .gz of a
tar), an ``s3://bucket/prefix``. Labels (``tasks.labelling``): class folders, a labels file, or none.
Wrapper folders (``export/photos/<class>/...``) are skipped down to the real base folder; hidden files,
``__MACOSX``, ``.DS_Store`` and ``Thumbs.db`` are ignored. Every image is decoded in full; one that cannot
be (empty, damaged, truncated, not an image, over Pillow's decompression-bomb guard) is quarantined with
the reason in the manifest. Images are copied byte for byte unless a ``Normalisation`` is given.

The source is only read, and nothing is written outside ``output``. An output already converted from the
same content with the same settings (``conversion_hash``) is returned as it is.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from PIL import Image, ImageOps, UnidentifiedImageError

from tasks.errors import InvalidDatasetError
from tasks.fileio import staged_directory
from tasks.image_directory import (
    FORMAT_VERSION,
    IMAGE_EXTENSIONS,
    MANIFEST_NAME,
    ImageDirectory,
    ImageDirectoryManifest,
    ImageRecord,
    Normalisation,
    QuarantinedFile,
    class_folders,
    safe_name,
)
from tasks.labelling import SourceFile, find_base_folder, plan_source, read_labels_file
from tasks.sources import DEFAULT_MAX_EXTRACTED_BYTES, Source
from tasks.storage import is_s3_uri, read_bytes

# Formats whose encoder would otherwise pick a low default quality when re-encoding a normalised image.
_SAVE_OPTIONS = {"JPEG": {"quality": 95}, "WEBP": {"quality": 95}}


def decode(data: bytes, normalisation: Normalisation | None) -> tuple[bytes, int, int, str]:
    """Decode ``data`` in full (truncation and damage only show then): the bytes to store, width, height, mode."""
    with Image.open(io.BytesIO(data)) as image:
        if normalisation is None:
            width, height, mode = image.width, image.height, image.mode
            # A JPEG drafted to 1/8 scale is still entropy-decoded to its last byte, so truncation and damage
            # still show, but most of the IDCT and colour conversion (needed only to re-encode) is skipped.
            image.draft(None, (1, 1))
            image.load()
            return data, width, height, mode
        image.load()
        fmt = image.format
        result = ImageOps.exif_transpose(image).convert(normalisation.mode)
    if normalisation.max_side and max(result.size) > normalisation.max_side:
        result.thumbnail((normalisation.max_side, normalisation.max_side), Image.Resampling.LANCZOS)
    encoded = io.BytesIO()
    result.save(encoded, format=fmt, **_SAVE_OPTIONS.get(fmt, {}))
    return encoded.getvalue(), result.width, result.height, result.mode


def store_image(
    file: SourceFile, target: PurePosixPath, root: Path, normalisation: Normalisation | None
) -> ImageRecord | QuarantinedFile:
    """Check one image and write it to ``root / target``: an ImageRecord, or why it was quarantined."""
    data = file.path.read_bytes()  # once: decoding, hashing and writing all use these bytes
    if not data:
        return QuarantinedFile(path=file.relative.as_posix(), reason="empty file (0 bytes)")
    try:
        data, width, height, mode = decode(data, normalisation)
    except Image.DecompressionBombError as error:
        return QuarantinedFile(path=file.relative.as_posix(), reason=f"over Pillow's decompression-bomb guard: {error}")
    except UnidentifiedImageError:
        reason = "not an image: Pillow cannot identify the file's format"
        return QuarantinedFile(path=file.relative.as_posix(), reason=reason)
    except (OSError, SyntaxError, ValueError, EOFError) as error:
        return QuarantinedFile(path=file.relative.as_posix(), reason=f"damaged or truncated image: {error}")
    destination = root / target
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_bytes(data)
    return ImageRecord(
        path=target.as_posix(),
        label=file.label,
        sha256=hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
        width=width,
        height=height,
        mode=mode,
        source_path=file.relative.as_posix(),
    )


def stored_path(file: SourceFile, folders: dict[str, str], by_class_folder: bool) -> PurePosixPath:
    """Where a file goes: below its class's folder, every component made safe (``safe_name``)."""
    parts = file.relative.parts[1:] if by_class_folder else file.relative.parts
    prefix = (folders[file.label],) if file.label is not None else ()
    return PurePosixPath(*prefix, *(safe_name(p) for p in parts))


def read_location(location: str) -> bytes:
    """A labels file's bytes from a local path or an ``s3://bucket/key``."""
    if not is_s3_uri(location) and not Path(location).is_file():
        raise InvalidDatasetError(f"labels file {location} does not exist")
    return read_bytes(location)


def _check_locations(source: Source, output: Path) -> None:
    if not is_s3_uri(source.location) and (
        output.is_relative_to(source.path) or (source.path.is_dir() and source.path.is_relative_to(output))
    ):
        raise InvalidDatasetError(f"output {output} and source {source.location} must not contain each other")
    if output.exists() and any(output.iterdir()) and not (output / MANIFEST_NAME).is_file():
        raise InvalidDatasetError(f"output {output} exists and is not an ImageDirectory: choose an empty or new folder")


def _previous(output: Path, conversion_hash: str) -> ImageDirectory | None:
    try:
        previous = ImageDirectory(output)
    except (InvalidDatasetError, ValueError):
        return None
    return previous if previous.manifest.conversion_hash == conversion_hash else None


def convert_to_image_directory(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    labels: str | os.PathLike[str] | None = None,
    labeled: bool | None = None,
    normalisation: Normalisation | None = None,
    max_extracted_bytes: int = DEFAULT_MAX_EXTRACTED_BYTES,
    threads: int | None = None,
) -> ImageDirectory:
    """Convert ``source`` (folder, archive or ``s3://`` prefix) into an ImageDirectory at ``output``.

    ``labels``: a labels file (path or ``s3://`` URI) for a flat folder. ``labeled``: None infers it;
    False takes every image unlabeled (for scoring); True refuses a source without labels. A previous
    ImageDirectory at ``output`` is reused when its ``conversion_hash`` matches, else replaced only once
    the new one is complete.
    """
    origin = Source(os.fspath(source), max_extracted_bytes)
    output = Path(output).resolve()
    _check_locations(origin, output)
    labels = os.fspath(labels) if labels is not None else None
    labels_data = read_location(labels) if labels else None
    settings = {
        "format_version": FORMAT_VERSION,
        "location": origin.location,
        "source": origin.fingerprint(),
        "labels": hashlib.sha256(labels_data).hexdigest() if labels_data is not None else None,
        "labeled": labeled,
        "normalisation": normalisation.model_dump() if normalisation else None,
    }
    conversion_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    if (previous := _previous(output, conversion_hash)) is not None:
        return previous
    table = (read_labels_file(labels_data, labels), labels) if labels_data is not None else None
    with origin.open() as opened, staged_directory(output) as staging:
        plan, labels_source = plan_source(find_base_folder(opened.folder), labels=table, labeled=labeled)
        classes = sorted({f.label for f in plan.files if f.label is not None})
        folders = class_folders(classes)
        by_class_folder = plan.labeled and labels_source is None
        # Decoding, hashing and file I/O run in C and release the GIL: threads overlap them.
        with ThreadPoolExecutor(max_workers=threads or min(16, 2 * (os.cpu_count() or 1))) as pool:
            results = list(
                pool.map(
                    lambda f: store_image(f, stored_path(f, folders, by_class_folder), staging, normalisation),
                    plan.files,
                )
            )
        images = [r for r in results if isinstance(r, ImageRecord)]
        quarantined = opened.skipped + plan.refused + [r for r in results if isinstance(r, QuarantinedFile)]
        if not images:
            raise InvalidDatasetError(
                f"{origin.location} holds no readable images (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}; "
                f"{len(quarantined)} files quarantined{': ' + quarantined[0].reason if quarantined else ''})"
            )
        counts = Counter(r.label for r in images)
        kept = [c for c in classes if counts[c]]
        warnings = list(plan.warnings)
        if unreadable := [c for c in classes if not counts[c]]:
            warnings.append(f"classes whose every image was quarantined, left out: {', '.join(map(repr, unreadable))}")
        if plan.labeled and len(kept) == 1:
            warnings.append(f"only one class ({kept[0]!r}): training a classifier needs at least two")
        manifest = ImageDirectoryManifest(
            labeled=plan.labeled,
            classes=kept,
            counts={c: counts[c] for c in kept},
            images=images,
            source=origin.location,
            quarantined=quarantined,
            class_folders={c: folders[c] for c in kept},
            labels_source=labels or labels_source,
            normalisation=normalisation,
            conversion_hash=conversion_hash,
            warnings=warnings,
        )
        ImageDirectory.write(staging, manifest)
    return ImageDirectory(output)


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.artifacts import create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from tasks.retrying import retry_unless_input_error  # noqa: E402


@task(
    name="convert", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE
)
def convert(
    source: str,
    output: str,
    role: str,
    labels: str | None = None,
    labeled: bool | None = None,
    normalisation: Normalisation | None = None,
    max_extracted_bytes: int = DEFAULT_MAX_EXTRACTED_BYTES,
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
        normalisation=normalisation,
        max_extracted_bytes=max_extracted_bytes,
    )
    manifest, logger = image_dir.manifest, get_run_logger()
    rows = [
        {"class": c, "folder": manifest.class_folders.get(c, c), "images": manifest.counts[c]} for c in manifest.classes
    ]
    create_table_artifact(
        key=f"{role}-images",
        table=rows or [{"class": "(unlabeled)", "folder": "", "images": len(manifest.images)}],
        description=f"{role}: {len(manifest.images)} images in {len(manifest.classes)} classes from {manifest.source}; "
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
        role, len(manifest.images), len(manifest.classes), len(manifest.quarantined), image_dir.root,
    )  # fmt: skip
    return str(image_dir.root)
