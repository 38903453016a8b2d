"""Where Convert to Image Directory reads from: a folder, an archive, or an ``s3://bucket/prefix`` (of images,
or naming one archive object). ``locations.open_source`` picks the type once (``FolderSource`` and
``ArchiveSource`` here, ``s3_source.S3Source``); the rest of conversion sees only the ``Source`` interface:

    fingerprint()  a digest of the content (cheap where the store already knows one: S3 ETags)
    open()         a local folder to read: a folder is read in place; archives (unpacked by
                   ``tasks.convert.archives``) and S3 objects go to a temporary folder removed afterwards
    overlaps(p)    whether writing to ``p`` would write into the source (or the source into ``p``)

More declared bytes than ``max_extracted_bytes`` are refused with ``InvalidDatasetError`` before anything is
written. The opened folder is then walked once (``tasks.convert.listing``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tasks.contracts.image_directory import QuarantinedFile
from tasks.convert.archives import extract_archive
from tasks.convert.listing import list_folder
from tasks.errors import OutputStorageError
from tasks.storage.local_files import in_order, megabytes, sha256_file


@dataclass
class OpenedSource:
    folder: Path
    skipped: list[QuarantinedFile] = field(default_factory=list)  # left behind while opening, with the reason


def content_digest(lines: Iterable[str]) -> str:
    """One sha256 over the lines (each a file's name and its content's hash or ETag)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


class Source(ABC):
    """A user's source location; ``location`` is how the manifest records it."""

    location: str

    @abstractmethod
    def fingerprint(self) -> str:
        """A digest that changes whenever a file's content, name or place changes."""

    @abstractmethod
    def open(self) -> contextlib.AbstractContextManager[OpenedSource]:
        """The source as a local folder, for as long as the context lasts."""

    def overlaps(self, output: Path) -> bool:
        return False


class _LocalSource(Source):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)

    def overlaps(self, output: Path) -> bool:
        return output.is_relative_to(self.path) or (self.path.is_dir() and self.path.is_relative_to(output))


def _hash_or_unreadable(path: Path) -> str:
    """A file's sha256; one this process may not read stands in as such (the conversion quarantines it)."""
    try:
        return sha256_file(path)
    except PermissionError as error:
        return f"unreadable: [Errno {error.errno}]"


class FolderSource(_LocalSource):
    """A folder, read in place."""

    def fingerprint(self) -> str:
        # Hashing runs in C and releases the GIL, so threads overlap it with reading; a window of files at a time.
        def hashed(relative: PurePosixPath) -> str:
            return f"{relative.as_posix()}\0{_hash_or_unreadable(self.path / relative)}"

        with ThreadPoolExecutor(max_workers=4) as pool:
            return content_digest(in_order(pool, hashed, ((f,) for f in list_folder(self.path).files())))

    @contextlib.contextmanager
    def open(self) -> Iterator[OpenedSource]:
        yield OpenedSource(self.path)


@contextlib.contextmanager
def scratch_space(what: str, scratch: Path, needed: int | None = None) -> Iterator[None]:
    """Around filling the temporary folder an archive or S3 source is read into: a disk that fills there is a
    storage fault (``OutputStorageError``, with where and how much), never a damaged archive or object."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        free, size = shutil.disk_usage(scratch).free, f"about {megabytes(needed)} needed, " if needed else ""
        raise OutputStorageError(
            f"no space left {what} into the temporary folder {scratch}: [Errno {error.errno}] {error.strerror}; "
            f"{size}{megabytes(free)} free there: free space there, or point TMPDIR at a folder with more room"
        ) from None


@contextlib.contextmanager
def unpacked(archive: Path, scratch: Path, max_bytes: int) -> Iterator[OpenedSource]:
    """``archive`` unpacked below ``scratch``, as an opened source (no space there: one clear error)."""
    with scratch_space(f"to unpack {archive}", scratch):
        skipped = extract_archive(archive, scratch / "files", max_bytes)
    yield OpenedSource(scratch / "files", skipped)


class ArchiveSource(_LocalSource):
    """A .zip / .tar(.gz|.bz2|.xz) / .tgz file (or a .gz of a tar), unpacked to a temporary folder."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        super().__init__(path)
        self.max_bytes = max_bytes

    def fingerprint(self) -> str:
        return sha256_file(self.path)

    @contextlib.contextmanager
    def open(self) -> Iterator[OpenedSource]:
        with tempfile.TemporaryDirectory(prefix="convert-") as scratch:
            with unpacked(self.path, Path(scratch), self.max_bytes) as opened:
                yield opened
