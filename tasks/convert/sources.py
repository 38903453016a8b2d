"""Where Convert to Image Directory reads from: a folder, an archive, or an ``s3://bucket/prefix`` (of images,
or naming one archive object). ``open_source`` picks the type once; the rest of conversion sees only the
``Source`` interface:

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

from tasks.convert.archives import extract_archive, refuse_oversize
from tasks.convert.listing import is_os_litter, list_folder
from tasks.errors import InvalidDatasetError, OutputStorageError
from tasks.fileio import in_order, megabytes, sha256_file
from tasks.image_directory import QuarantinedFile
from tasks.storage import S3Location, download_s3_object, is_s3_uri, parse_s3_uri, s3_client

DEFAULT_MAX_EXTRACTED_BYTES = 64 * 2**30
_DOWNLOAD_THREADS = 8


@dataclass
class OpenedSource:
    folder: Path
    skipped: list[QuarantinedFile] = field(default_factory=list)  # left behind while opening, with the reason


def _digest(lines: Iterable[str]) -> str:
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
            return _digest(in_order(pool, hashed, ((f,) for f in list_folder(self.path).files())))

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
def _unpacked(archive: Path, scratch: Path, max_bytes: int) -> Iterator[OpenedSource]:
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
            with _unpacked(self.path, Path(scratch), self.max_bytes) as opened:
                yield opened


@dataclass(frozen=True, slots=True)
class S3Object:
    """One object to download (slotted, its local path a slice of its key: a prefix may hold a million)."""

    key: str
    cut: int  # where in the key its path below the local folder starts
    size: int
    etag: str

    @property
    def relative(self) -> str:
        """Where it goes below the local folder."""
        return self.key[self.cut :]


@dataclass(frozen=True)
class S3Listing:
    objects: list[S3Object]
    skipped: list[QuarantinedFile]  # keys that cannot become files below the local folder, with the reason


def _s3_key_problem(relative: str) -> str | None:
    """Why an object key (relative to the prefix) cannot be a file below the local folder, if it cannot."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        return (
            "its key is not a plain relative path (it has '..', '.', '//' or '\\' in it): "
            "it could land outside the folder"
        )
    return None


def _sort_s3_objects(listed: list[S3Object]) -> S3Listing:
    """Keeps what can be written below one folder; reports the rest instead of failing half way through."""
    objects, skipped = [], []
    for obj in listed:
        if problem := _s3_key_problem(obj.relative):
            skipped.append(QuarantinedFile(path=obj.relative, reason=problem))
        elif not is_os_litter(PurePosixPath(obj.relative).name):
            # Hidden keys come down too: the folder rules then apply (a hidden folder of images beside the
            # class folders is a class, ".net"; other hidden entries are skipped and reported).
            objects.append(obj)
    # S3 allows "cat" beside "cat/0.png"; a file system does not allow a file to be a folder too.
    folders = {
        "/".join(o.relative.split("/")[:depth]): o.relative
        for o in objects
        for depth in range(1, o.relative.count("/") + 1)
    }
    skipped += [
        QuarantinedFile(
            path=o.relative,
            reason=f"the object's key is also the folder of {folders[o.relative]!r}: a file cannot be a folder too",
        )
        for o in objects
        if o.relative in folders
    ]
    return S3Listing([o for o in objects if o.relative not in folders], skipped)


class S3Source(Source):
    """Objects below ``s3://bucket/prefix`` (downloaded to a temporary folder), or one archive object."""

    def __init__(self, uri: str, max_bytes: int) -> None:
        self.where: S3Location = parse_s3_uri(uri)
        self.location, self.max_bytes = uri, max_bytes
        self._listing: S3Listing | None = None

    def _list(self) -> S3Listing:
        from botocore.exceptions import ClientError

        client = s3_client()
        if self.where.prefix:
            try:
                head = client.head_object(Bucket=self.where.bucket, Key=self.where.prefix)
                name = self.where.prefix.rsplit("/", 1)[-1]
                cut = len(self.where.prefix) - len(name)
                return S3Listing([S3Object(self.where.prefix, cut, head["ContentLength"], head["ETag"])], [])
            except ClientError as error:
                if error.response["Error"]["Code"] not in ("404", "NoSuchKey"):
                    raise
        prefix = f"{self.where.prefix}/" if self.where.prefix else ""
        listed = []
        try:  # page by page, keeping a small object per key (a page's dicts are several times larger)
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.where.bucket, Prefix=prefix):
                listed += [
                    S3Object(o["Key"], len(prefix), o["Size"], o["ETag"])
                    for o in page.get("Contents", [])
                    if not o["Key"].endswith("/")  # "folder/" markers of the S3 console
                ]
        except ClientError as error:
            if error.response["Error"]["Code"] == "NoSuchBucket":
                raise InvalidDatasetError(
                    f"source {self.location}: bucket {self.where.bucket!r} does not exist"
                ) from error
            raise
        return _sort_s3_objects(listed)

    @property
    def listing(self) -> S3Listing:
        """The objects to read and the keys skipped, listed once; a source holding nothing readable is refused."""
        if self._listing is None:
            self._listing = self._list()
            if not self._listing.objects:
                skipped = "; ".join(f"{q.path!r}: {q.reason}" for q in self._listing.skipped)
                read = f" it can read (skipped {skipped})" if skipped else ""
                raise InvalidDatasetError(f"source {self.location} holds no objects{read}")
        return self._listing

    @property
    def is_one_object(self) -> bool:
        objects = self.listing.objects
        return len(objects) == 1 and objects[0].key == self.where.prefix

    def fingerprint(self) -> str:
        return _digest(
            [
                *(f"{o.relative}\0{o.etag}\0{o.size}" for o in sorted(self.listing.objects, key=lambda o: o.relative)),
                *sorted(f"skipped\0{q.path}\0{q.reason}" for q in self.listing.skipped),
            ]
        )

    def _download(self, destination: Path) -> None:
        """Stream each object to a file below ``destination`` (chunked, each read again if its body is cut off)."""
        client = s3_client()

        def fetch(obj: S3Object) -> None:
            download_s3_object(client, self.where.bucket, obj.key, destination / obj.relative)

        needed = sum(o.size for o in self.listing.objects)
        with scratch_space(f"to download {self.location}", destination, needed):
            destination.mkdir(parents=True, exist_ok=True)
            with ThreadPoolExecutor(max_workers=_DOWNLOAD_THREADS) as pool:  # a window of downloads at a time
                for _ in in_order(pool, fetch, ((o,) for o in self.listing.objects)):
                    pass

    @contextlib.contextmanager
    def open(self) -> Iterator[OpenedSource]:
        objects = self.listing.objects
        refuse_oversize(self.location, sum(o.size for o in objects), self.max_bytes)
        with tempfile.TemporaryDirectory(prefix="convert-") as scratch:
            scratch = Path(scratch)
            if not self.is_one_object:
                self._download(scratch / "files")
                yield OpenedSource(scratch / "files", list(self.listing.skipped))
                return
            self._download(scratch / "download")
            with _unpacked(scratch / "download" / objects[0].relative, scratch, self.max_bytes) as opened:
                yield opened


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
