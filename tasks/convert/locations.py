"""A conversion's source location as its type: a folder, an archive file, or an ``s3://`` prefix."""

from __future__ import annotations

from pathlib import Path

from tasks.contracts.conversion_limits import DEFAULT_MAX_EXTRACTED_BYTES
from tasks.convert.s3_source import S3Source
from tasks.convert.sources import ArchiveSource, FolderSource, Source
from tasks.errors import InvalidDatasetError
from tasks.storage.s3 import is_s3_uri


def open_source(location: str, max_extracted_bytes: int = DEFAULT_MAX_EXTRACTED_BYTES) -> Source:
    """The source at ``location`` as its type; a local one that does not exist (or is neither a folder nor a
    regular file) is refused here."""
    if is_s3_uri(location):
        return S3Source(location, max_extracted_bytes)
    path = Path(location).resolve()
    if path.is_dir():
        return FolderSource(path)
    if path.is_file():
        return ArchiveSource(path, max_extracted_bytes)
    if not path.exists():
        raise InvalidDatasetError(f"source {path} does not exist")
    raise InvalidDatasetError(f"source {path} is neither a folder nor a regular file (an archive)")
