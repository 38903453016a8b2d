"""Convert to Image Directory: a folder, archive or S3 prefix of images becomes an ImageDirectory.

Sources (``tasks.convert.sources``): a folder, a .zip/.tar/.tar.gz/.tgz/.tar.bz2/.tar.xz archive (or a .gz of a
tar), an ``s3://bucket/prefix``. Labels (``tasks.convert.labelling``): class folders, a labels file, or none.
Wrapper folders (``export/photos/<class>/...``) are skipped down to the real base folder; ``__MACOSX``,
``.DS_Store`` and ``Thumbs.db`` are ignored; hidden entries, links leaving the source and special files are
skipped and reported. Every image is identified from its header first (nothing is read whole), refused
above ``max_image_pixels``, then decoded in full (truncation and damage only show then) while the threads
together hold at most ``decode_memory_bytes`` of decoded pixels. One that cannot be read is quarantined
with the reason in the manifest ("unreadable file: [Errno 13] …" when the source itself cannot be read).
Images are copied byte for byte unless a ``Normalisation`` is given. A fault writing the output (full disk,
quota, read-only, I/O, permission) stops the conversion with ``OutputStorageError`` (where, free, needed),
after a check of the free space before any work; no manifest is written, and the images stored so far stay in
``.<output>.partial-<hash>`` beside it, for the next attempt with the same content and settings to go on from
(``tasks.convert.storing``: each image is journalled once complete).

The source is only read, and nothing is written outside ``output``; no stored file is ever overwritten
(names that collide once made safe get ``~2``, ``~3``). An output already converted from the same content
with the same settings (``conversion_hash``) is returned as it is.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from tasks.allocator import release_free_memory
from tasks.contracts.conversion_limits import (
    DEFAULT_DECODE_MEMORY_BYTES,
    DEFAULT_MAX_EXTRACTED_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
)
from tasks.contracts.image_directory import (
    FORMAT_VERSION,
    IMAGE_EXTENSIONS,
    MANIFEST_NAME,
    ImageDirectory,
    ImageDirectoryManifest,
    ImageRecord,
    Normalisation,
    QuarantinedFile,
    class_folders,
)
from tasks.contracts.image_index import FIXED_COLUMNS, INDEX_NAME, Row
from tasks.contracts.index_writer import IndexWriter
from tasks.convert.labelling import SingleClass, plan_source
from tasks.convert.labels_file import read_labels_file
from tasks.convert.listing import list_folder
from tasks.convert.locations import open_source
from tasks.convert.output_folder import (
    StoredJournal,
    WriteFailed,
    converted_before,
    resumable_folder,
    storage_error,
    writing,
)
from tasks.convert.plan import examples_of
from tasks.convert.sources import Source
from tasks.convert.storing import DecodeBudget, ImageWriter, StoreSettings, space_needed
from tasks.errors import InvalidDatasetError
from tasks.progress import every_while, run_logger
from tasks.storage.local_files import in_order, require_space
from tasks.storage.s3 import is_s3_uri, read_bytes

_TRIM_EVERY = 4096  # images stored between two hand-backs of the threads' freed memory (tasks.allocator)
logger = logging.getLogger(__name__)


class _Found:
    """What the stored images add up to, as each record goes into the index."""

    def __init__(self, classes: list[str], index: IndexWriter) -> None:
        self.position = {name: i for i, name in enumerate(classes)}
        self.index = index
        self.counts: Counter[str | None] = Counter()
        self.bombs, self.bomb_examples = 0, []

    def add(self, record: ImageRecord) -> None:
        label = -1 if record.label is None else self.position[record.label]
        self.index.append(
            Row(
                record.path,
                record.source_path,
                label,
                record.sha256,
                record.size_bytes,
                record.width,
                record.height,
                record.mode,
                record.orientation,
                record.perceptual_hash,
            )
        )
        self.counts[record.label] += 1
        if record.width * record.height > Image.MAX_IMAGE_PIXELS:
            self.bombs += 1
            if len(self.bomb_examples) < 5:
                self.bomb_examples.append(repr(record.source_path))


def read_location(location: str) -> bytes:
    """A labels file's bytes from a local path or an ``s3://bucket/key``."""
    if not is_s3_uri(location) and not Path(location).is_file():
        raise InvalidDatasetError(f"labels file {location} does not exist")
    return read_bytes(location)


def _check_locations(source: Source, output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise InvalidDatasetError(
            f"output {output} is an existing file, not a folder: give a new or empty folder, or an ImageDirectory "
            "to replace (the file is left as it is)"
        )
    if source.overlaps(output):
        raise InvalidDatasetError(f"output {output} and source {source.location} must not contain each other")
    if output.exists() and any(output.iterdir()) and not (output / MANIFEST_NAME).is_file():
        raise InvalidDatasetError(f"output {output} exists and is not an ImageDirectory: choose an empty or new folder")


def convert_to_image_directory(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    labels: str | os.PathLike[str] | None = None,
    labeled: bool | None = None,
    single_class: SingleClass = "labeled",
    normalisation: Normalisation | None = None,
    max_extracted_bytes: int = DEFAULT_MAX_EXTRACTED_BYTES,
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    decode_memory_bytes: int = DEFAULT_DECODE_MEMORY_BYTES,
    threads: int | None = None,
) -> ImageDirectory:
    """Convert ``source`` (folder, archive or ``s3://`` prefix) into an ImageDirectory at ``output``.

    ``labels``: a labels file (path or ``s3://`` URI) for a flat folder. ``labeled``: None infers it;
    False takes every image unlabeled (for scoring); True refuses a source without labels. ``single_class``
    "unlabeled" reads a source holding one class folder as images to score when ``labeled`` is None.
    Images over ``max_image_pixels`` are quarantined; the decoding threads hold at most
    ``decode_memory_bytes`` of pixels at once. A previous ImageDirectory at ``output`` is reused when its
    ``conversion_hash`` matches, else replaced only once the new one is complete. A progress line is logged
    every ``PROGRESS_SECONDS`` while it runs.
    """
    origin = open_source(os.fspath(source), max_extracted_bytes)
    progress = _Progress(origin.location)
    with every_while(progress.line, run_logger(logger)):
        return _convert(
            origin,
            Path(output).resolve(),
            progress,
            labels,
            labeled,
            single_class,
            normalisation,
            max_extracted_bytes,
            max_image_pixels,
            decode_memory_bytes,
            threads,
        )


class _Progress:
    """What a conversion is doing, for its progress line."""

    def __init__(self, location: str) -> None:
        self.location, self.phase = location, "reading the source"
        self.writer: ImageWriter | None = None
        self.total = 0

    def line(self) -> str:
        if self.writer is None:
            return f"converting {self.location}: {self.phase}"
        done = self.writer.counts
        return (
            f"converting {self.location}: {done['stored'] + done['reused']} of {self.total} images stored "
            f"({done['reused']} by an earlier attempt), {done['quarantined']} quarantined"
        )


def _convert(
    origin: Source,
    output: Path,
    progress: _Progress,
    labels: str | os.PathLike[str] | None,
    labeled: bool | None,
    single_class: SingleClass,
    normalisation: Normalisation | None,
    max_extracted_bytes: int,
    max_image_pixels: int,
    decode_memory_bytes: int,
    threads: int | None,
) -> ImageDirectory:
    _check_locations(origin, output)
    labels = os.fspath(labels) if labels is not None else None
    labels_data = read_location(labels) if labels else None
    settings = {
        "format_version": FORMAT_VERSION,
        "location": origin.location,
        "source": origin.fingerprint(),
        "labels": hashlib.sha256(labels_data).hexdigest() if labels_data is not None else None,
        "labeled": labeled,
        "single_class": single_class,
        "normalisation": normalisation.model_dump() if normalisation else None,
        "max_image_pixels": max_image_pixels,
        # An index written before a column was added lacks it (e.g. perceptual hashes): converted again.
        "index_columns": sorted(FIXED_COLUMNS),
    }
    conversion_hash = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
    if (previous := converted_before(output, conversion_hash)) is not None:
        return previous
    table = (read_labels_file(labels_data, labels), labels) if labels_data is not None else None
    store = StoreSettings(normalisation, max_image_pixels, DecodeBudget(decode_memory_bytes))
    progress.phase = "unpacking or downloading the source"
    with origin.open() as opened, resumable_folder(output, conversion_hash) as partial:
        progress.phase = "listing the images"
        plan, labels_source = plan_source(
            opened.folder, list_folder(opened.folder), labels=table, labeled=labeled, single_class=single_class
        )
        classes, folders = plan.classes, class_folders(plan.classes)
        journal = StoredJournal(partial)
        if journal.reusable:
            run_logger(logger).info("%s: %d images stored by an earlier attempt are reused", output, journal.reusable)
        progress.phase = "measuring the images"
        planned_bytes = needed = 0
        for file in plan.files():
            size = file.size()
            planned_bytes, needed = planned_bytes + size, needed + space_needed(size, normalisation)
        needed -= journal.stored_bytes
        require_space(partial, max(needed, 0), "the conversion", "the images' size", "output")
        writer = ImageWriter(partial, store, journal)
        progress.writer, progress.total = writer, plan.count
        index = IndexWriter(partial / INDEX_NAME)
        found = _Found(classes, index)
        quarantined = opened.skipped + plan.refused
        try:
            # Decoding, hashing and file I/O run in C and release the GIL: threads overlap them. The records go
            # to the index as they come, in the planned order, so memory does not grow with the images.
            with ThreadPoolExecutor(max_workers=threads or min(16, 2 * (os.cpu_count() or 1))) as pool:
                for done, result in enumerate(in_order(pool, writer, plan.stored(folders)), 1):
                    if done % _TRIM_EVERY == 0:
                        release_free_memory()
                    if isinstance(result, ImageRecord):
                        with writing():  # the index's rows go to the output's storage too
                            found.add(result)
                    elif isinstance(result, QuarantinedFile):
                        quarantined.append(result)
        except WriteFailed as failed:
            index.close()
            journal.close()
            raise storage_error(output, failed.error, partial, journal, planned_bytes - journal.source_bytes) from None
        counts = found.counts
        if not index.count:
            raise InvalidDatasetError(
                f"{origin.location} holds no readable images (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}; "
                f"{len(quarantined)} files quarantined{': ' + quarantined[0].reason if quarantined else ''})"
            )
        kept = [c for c in classes if counts[c]]
        warnings = list(plan.warnings)
        if plan.renamed:
            warnings.append(
                f"{len(plan.renamed)} files whose names collide once made safe (or differ only in letter case or "
                f"Unicode normalisation) were stored under new names: {plan.renamed.text(quoted=False)}"
            )
        if unreadable := [c for c in classes if not counts[c]]:
            warnings.append(f"classes whose every image was quarantined, left out: {', '.join(map(repr, unreadable))}")
        if plan.labeled and len(kept) == 1:
            warnings.append(f"only one class ({kept[0]!r}): training a classifier needs at least two")
        if found.bombs:
            warnings.append(
                f"Pillow's DecompressionBombWarning: {found.bombs} stored images have more than Image.MAX_IMAGE_PIXELS "
                f"({Image.MAX_IMAGE_PIXELS:,}) pixels, kept because max_image_pixels allows them: "
                f"{examples_of(found.bomb_examples, quoted=False)}"
            )
        manifest = ImageDirectoryManifest(
            labeled=plan.labeled,
            classes=kept,
            counts={c: counts[c] for c in kept},
            source=origin.location,
            quarantined=quarantined,
            class_folders={c: folders[c] for c in kept},
            labels_source=labels or labels_source,
            normalisation=normalisation,
            conversion_hash=conversion_hash,
            warnings=warnings,
        )
        # Classes whose every image was quarantined are left out: the later ones move up a place.
        index.relabel = np.cumsum([bool(counts[c]) for c in classes], dtype=np.int32) - 1
        try:
            with writing():
                ImageDirectory.write(partial, manifest, index)
        except WriteFailed as failed:
            raise storage_error(output, failed.error, partial, journal, 0) from None
        journal.remove()
    return ImageDirectory(output)
