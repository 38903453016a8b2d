"""Where Convert to Image Directory reads from: a folder, an archive, or an ``s3://bucket/prefix``.

Each source gives a content fingerprint (cheap where the store already knows one: S3 ETags) and opens as
a local folder to read: a folder is read in place; archives (unpacked by ``tasks.archives``) and S3
objects go to a temporary folder that is removed afterwards. More declared bytes than
``max_extracted_bytes`` are refused with ``InvalidDatasetError`` before anything is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tasks.archives import extract_archive, refuse_oversize, unsafe_member_name
from tasks.errors import InvalidDatasetError
from tasks.fileio import sha256_file
from tasks.image_directory import MANIFEST_NAME, QuarantinedFile
from tasks.storage import is_s3_uri, parse_s3_uri, s3_client

DEFAULT_MAX_EXTRACTED_BYTES = 64 * 2**30
# An ImageDirectory given as a source is read as the class folders it is, without its manifest.
IGNORED_NAMES = frozenset({"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini", MANIFEST_NAME})
_DOWNLOAD_THREADS = 8


def visible(relative: PurePosixPath) -> bool:
    """False for hidden files and the litter of macOS and Windows, at any depth."""
    return not any(part.startswith(".") or part in IGNORED_NAMES for part in relative.parts)


@dataclass
class OpenedSource:
    folder: Path
    skipped: list[QuarantinedFile] = field(default_factory=list)  # left behind while opening, with the reason


@dataclass(frozen=True)
class S3Object:
    key: str
    relative: str  # where it goes below the local folder
    size: int
    etag: str


def list_s3(uri: str) -> list[S3Object]:
    """The visible objects below ``s3://bucket/prefix``; a URI naming one object (an archive) gives that object."""
    from botocore.exceptions import ClientError

    location, client = parse_s3_uri(uri), s3_client()
    if location.prefix:
        try:
            head = client.head_object(Bucket=location.bucket, Key=location.prefix)
            return [S3Object(location.prefix, PurePosixPath(location.prefix).name, head["ContentLength"], head["ETag"])]
        except ClientError as error:
            if error.response["Error"]["Code"] not in ("404", "NoSuchKey"):
                raise
    prefix = f"{location.prefix}/" if location.prefix else ""
    try:
        pages = list(client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=prefix))
    except ClientError as error:
        if error.response["Error"]["Code"] == "NoSuchBucket":
            raise InvalidDatasetError(f"source {uri}: bucket {location.bucket!r} does not exist") from error
        raise
    return [
        S3Object(o["Key"], o["Key"][len(prefix) :], o["Size"], o["ETag"])
        for page in pages
        for o in page.get("Contents", [])
        if not o["Key"].endswith("/") and visible(PurePosixPath(o["Key"][len(prefix) :]))
    ]


def download_s3(uri: str, objects: list[S3Object], destination: Path) -> None:
    """Stream each object to a file below ``destination`` (chunked: no object is held in memory whole)."""
    location, client = parse_s3_uri(uri), s3_client()

    def fetch(obj: S3Object) -> None:
        target = destination / obj.relative
        target.parent.mkdir(parents=True, exist_ok=True)
        body = client.get_object(Bucket=location.bucket, Key=obj.key)["Body"]
        with open(target, "wb") as handle:
            shutil.copyfileobj(body, handle, 1 << 20)

    with ThreadPoolExecutor(max_workers=_DOWNLOAD_THREADS) as pool:
        list(pool.map(fetch, objects))


def _digest(lines: Iterator[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


class Source:
    """A user's source location: ``fingerprint()`` of its content, ``open()`` as a local folder."""

    def __init__(self, location: str, max_extracted_bytes: int = DEFAULT_MAX_EXTRACTED_BYTES) -> None:
        self.location, self.max_bytes = location, max_extracted_bytes
        self._s3_objects: list[S3Object] | None = None
        if not is_s3_uri(location):
            self.path = Path(location).resolve()
            if not self.path.exists():
                raise InvalidDatasetError(f"source {self.path} does not exist")
            self.location = str(self.path)

    def _objects(self) -> list[S3Object]:
        if self._s3_objects is None:
            self._s3_objects = list_s3(self.location)
            if not self._s3_objects:
                raise InvalidDatasetError(f"source {self.location} holds no objects")
            for obj in self._s3_objects:
                if unsafe_member_name(obj.relative):
                    raise InvalidDatasetError(
                        f"source {self.location}: refusing object key {obj.key!r}, which would land outside the folder"
                    )
        return self._s3_objects

    def fingerprint(self) -> str:
        """A digest that changes whenever a file's content, name or place changes."""
        if is_s3_uri(self.location):
            return _digest(
                f"{o.relative}\0{o.etag}\0{o.size}" for o in sorted(self._objects(), key=lambda o: o.relative)
            )
        if self.path.is_file():
            return sha256_file(self.path)
        files = sorted(
            p.relative_to(self.path).as_posix()
            for p in self.path.rglob("*")
            if visible(PurePosixPath(p.relative_to(self.path).as_posix())) and p.is_file()
        )
        # Hashing runs in C and releases the GIL, so threads overlap it with reading.
        with ThreadPoolExecutor(max_workers=4) as pool:
            hashes = pool.map(lambda name: sha256_file(self.path / name), files)
            return _digest(f"{name}\0{h}" for name, h in zip(files, hashes))

    @contextlib.contextmanager
    def open(self) -> Iterator[OpenedSource]:
        if not is_s3_uri(self.location) and self.path.is_dir():
            yield OpenedSource(self.path)
            return
        with tempfile.TemporaryDirectory(prefix="convert-") as scratch:
            scratch = Path(scratch)
            archive = self.path if not is_s3_uri(self.location) else None
            if archive is None:
                objects = self._objects()
                refuse_oversize(self.location, sum(o.size for o in objects), self.max_bytes)
                single_object = len(objects) == 1 and objects[0].key == parse_s3_uri(self.location).prefix
                download_s3(self.location, objects, scratch / ("download" if single_object else "files"))
                if not single_object:
                    yield OpenedSource(scratch / "files")
                    return
                archive = scratch / "download" / objects[0].relative
            skipped = extract_archive(archive, scratch / "files", self.max_bytes)
            yield OpenedSource(scratch / "files", skipped)
