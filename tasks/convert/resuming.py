"""Where a conversion writes, so that one stopped goes on: the ``.<output>.partial-<hash>`` folder it fills beside
the output (renamed over the output on success; kept when the storage stops it, or it is interrupted), the one
error a storage fault becomes, and the output already converted from the same content and settings (reused).
What each image's storing leaves in that folder, its journal, is ``storing.StoredJournal``."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from tasks.convert.storing import StoredJournal, WriteFailed, writing
from tasks.errors import InvalidDatasetError, OutputStorageError
from tasks.fileio import megabytes
from tasks.image_directory import ImageDirectory


def storage_error(
    output: Path, error: OSError, partial: Path, journal: StoredJournal | None, left: int
) -> OutputStorageError:
    """The conversion's one error when the output could not be written: where, the space, what was kept.
    ``left``: the source bytes of the images not stored yet; what they need is estimated at the size ratio of what
    this attempt stored (a normalised image may be larger than its source)."""
    stored = journal.images if journal else 0
    more = left * journal.attempt_bytes / journal.source_bytes if journal and journal.source_bytes else left
    return OutputStorageError(
        f"cannot write the converted images to {output}: [Errno {error.errno}] {error.strerror}; "
        f"{megabytes(shutil.disk_usage(partial).free)} free there, about {megabytes(int(more))} more needed; "
        f"no image was quarantined for it and no manifest written. The {stored} images stored so far are "
        f"kept in {partial}: once the storage is fixed, the same conversion goes on from there"
    )


@contextlib.contextmanager
def resumable_folder(output: Path, conversion_hash: str) -> Iterator[Path]:
    """The folder a conversion fills, beside ``output``: ``.<name>.partial-<hash>``, the same for every attempt
    with the same content and settings. On success it replaces ``output`` whole (and partial folders of other
    settings go); stopped by its storage, or interrupted, it stays for the next attempt to go on from; any other
    failure removes it."""
    partial = output.parent / f".{output.name}.partial-{conversion_hash[:16]}"
    try:
        with writing():
            partial.mkdir(parents=True, exist_ok=True)
    except WriteFailed as failed:
        raise storage_error(output, failed.error, output.parent, None, 0) from None
    try:
        yield partial
    except (OutputStorageError, KeyboardInterrupt):
        raise
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if output.exists():
        shutil.rmtree(output)
    partial.rename(output)
    for other in output.parent.glob(f".{output.name}.partial-*"):
        shutil.rmtree(other, ignore_errors=True)


def converted_before(output: Path, conversion_hash: str) -> ImageDirectory | None:
    """``output`` when it is an ImageDirectory already converted from the same content with the same settings."""
    try:
        previous = ImageDirectory(output)
    except (InvalidDatasetError, ValueError):
        return None
    return previous if previous.manifest.conversion_hash == conversion_hash else None
