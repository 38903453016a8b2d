"""Where Convert to Image Directory reads from: a folder, an archive, or an ``s3://bucket/prefix``.

Each source gives a content fingerprint (cheap where the store already knows one: S3 ETags) and opens as
a local folder to read: a folder is read in place; archives (unpacked by ``tasks.archives``) and S3
objects go to a temporary folder that is removed afterwards. More declared bytes than
``max_extracted_bytes`` are refused with ``InvalidDatasetError`` before anything is written.

An opened folder is walked once (``list_folder``): links are followed only where they resolve inside the
folder; links leading out of it, broken links, link loops and anything that is not a regular file or folder
(FIFOs, sockets, devices) are skipped, each reported with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tasks.archives import extract_archive, refuse_oversize
from tasks.errors import InvalidDatasetError
from tasks.fileio import sha256_file
from tasks.image_directory import MANIFEST_NAME, QuarantinedFile
from tasks.storage import download_s3_object, is_s3_uri, parse_s3_uri, s3_client

DEFAULT_MAX_EXTRACTED_BYTES = 64 * 2**30
# An ImageDirectory given as a source is read as the class folders it is, without its manifest.
IGNORED_NAMES = frozenset({"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini", MANIFEST_NAME})
_DOWNLOAD_THREADS = 8


def litter(name: str) -> bool:
    """Files that operating systems leave behind (and a manifest of an ImageDirectory given as a source)."""
    return name in IGNORED_NAMES or name.startswith("._")  # "._x": macOS AppleDouble metadata of x


@dataclass
class FolderListing:
    """Everything below a folder, relative to it: what can be read, and what was skipped with the reason."""

    files: list[PurePosixPath] = field(default_factory=list)
    folders: list[PurePosixPath] = field(default_factory=list)
    skipped: list[QuarantinedFile] = field(default_factory=list)


_SPECIAL_KINDS = {stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device",
                  stat.S_ISBLK: "a block device"}  # fmt: skip


def _link_problem(path: Path, root: Path) -> str | None:
    target = os.readlink(path)
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):  # RuntimeError: a link loop (Python < 3.13)
        return f"broken link to {target!r}: its target does not exist"
    if not resolved.is_relative_to(root):
        return f"link to {target!r}, outside the source: links are followed only where they stay inside it"
    return None


def list_folder(root: Path) -> FolderListing:
    """Walk ``root`` once, following links that stay inside it; litter is left out without a word."""
    root = root.resolve()
    listing = FolderListing()

    def skip(relative: PurePosixPath, reason: str) -> None:
        listing.skipped.append(QuarantinedFile(path=relative.as_posix(), reason=reason))

    def visit(folder: Path, relative: PurePosixPath, chain: frozenset[Path]) -> None:
        with os.scandir(folder) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            path, here = Path(entry.path), relative / entry.name
            if litter(entry.name):
                continue
            if entry.is_symlink() and (problem := _link_problem(path, root)):
                skip(here, problem)
                continue
            try:
                mode = path.stat().st_mode
            except OSError as error:
                skip(here, f"cannot be read: {error.strerror}")
                continue
            if stat.S_ISDIR(mode):
                real = path.resolve()
                if real in chain:  # a link back to a folder that holds it
                    skip(here, f"link to {os.readlink(path)!r}, a folder that holds it: following it would loop")
                    continue
                listing.folders.append(here)
                visit(path, here, chain | {real})
            elif stat.S_ISREG(mode):
                listing.files.append(here)
            else:
                kind = next((k for test, k in _SPECIAL_KINDS.items() if test(mode)), "not a regular file")
                skip(here, f"{kind}, not a regular file: only files, folders and links to them are read")

    visit(root, PurePosixPath(), frozenset({root}))
    listing.files.sort()
    return listing


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


@dataclass(frozen=True)
class S3Listing:
    objects: list[S3Object]
    skipped: list[QuarantinedFile]  # keys that cannot become files below the local folder, with the reason


def _s3_key_problem(relative: str) -> str | None:
    """Why an object key (relative to the prefix) cannot be a file below the local folder, if it cannot."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        return ("its key is not a plain relative path (it has '..', '.', '//' or '\\' in it): "
                "it could land outside the folder")
    return None


def _sort_s3_objects(listed: list[S3Object]) -> S3Listing:
    """Keeps what can be written below one folder; reports the rest instead of failing half way through."""
    objects, skipped = [], []
    for obj in listed:
        if problem := _s3_key_problem(obj.relative):
            skipped.append(QuarantinedFile(path=obj.relative, reason=problem))
        elif not litter(PurePosixPath(obj.relative).name):
            # Hidden keys come down too: the folder rules then apply (a hidden folder of images beside the
            # class folders is a class, ".net"; other hidden entries are skipped and reported).
            objects.append(obj)
    # S3 allows "cat" beside "cat/0.png"; a file system does not allow a file to be a folder too.
    folders = {"/".join(o.relative.split("/")[:depth]): o.relative
               for o in objects for depth in range(1, o.relative.count("/") + 1)}  # fmt: skip
    skipped += [QuarantinedFile(path=o.relative, reason=f"the object's key is also the folder of {folders[o.relative]!r}: "
                                "a file cannot be a folder too") for o in objects if o.relative in folders]  # fmt: skip
    return S3Listing([o for o in objects if o.relative not in folders], skipped)


def list_s3(uri: str) -> S3Listing:
    """The visible objects below ``s3://bucket/prefix`` and the keys skipped; a URI naming one object (an
    archive) gives that object."""
    from botocore.exceptions import ClientError

    location, client = parse_s3_uri(uri), s3_client()
    if location.prefix:
        try:
            head = client.head_object(Bucket=location.bucket, Key=location.prefix)
            name = PurePosixPath(location.prefix).name
            return S3Listing([S3Object(location.prefix, name, head["ContentLength"], head["ETag"])], [])
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
    return _sort_s3_objects([
        S3Object(o["Key"], o["Key"][len(prefix) :], o["Size"], o["ETag"])
        for page in pages
        for o in page.get("Contents", [])
        if not o["Key"].endswith("/")  # "folder/" markers of the S3 console
    ])  # fmt: skip


def download_s3(uri: str, objects: list[S3Object], destination: Path) -> None:
    """Stream each object to a file below ``destination`` (chunked, each read again if its body is cut off)."""
    location, client = parse_s3_uri(uri), s3_client()

    def fetch(obj: S3Object) -> None:
        download_s3_object(client, location.bucket, obj.key, destination / obj.relative)

    with ThreadPoolExecutor(max_workers=_DOWNLOAD_THREADS) as pool:
        list(pool.map(fetch, objects))


def _digest(lines: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


class Source:
    """A user's source location: ``fingerprint()`` of its content, ``open()`` as a local folder."""

    def __init__(self, location: str, max_extracted_bytes: int = DEFAULT_MAX_EXTRACTED_BYTES) -> None:
        self.location, self.max_bytes = location, max_extracted_bytes
        self._s3_listing: S3Listing | None = None
        if not is_s3_uri(location):
            self.path = Path(location).resolve()
            if not self.path.exists():
                raise InvalidDatasetError(f"source {self.path} does not exist")
            if not (self.path.is_dir() or self.path.is_file()):
                raise InvalidDatasetError(f"source {self.path} is neither a folder nor a regular file (an archive)")
            self.location = str(self.path)

    def _objects(self) -> S3Listing:
        if self._s3_listing is None:
            self._s3_listing = list_s3(self.location)
            if not self._s3_listing.objects:
                skipped = "; ".join(f"{q.path!r}: {q.reason}" for q in self._s3_listing.skipped)
                read = f" it can read (skipped {skipped})" if skipped else ""
                raise InvalidDatasetError(f"source {self.location} holds no objects{read}")
        return self._s3_listing

    def fingerprint(self) -> str:
        """A digest that changes whenever a file's content, name or place changes."""
        if is_s3_uri(self.location):
            listing = self._objects()
            return _digest([
                *(f"{o.relative}\0{o.etag}\0{o.size}" for o in sorted(listing.objects, key=lambda o: o.relative)),
                *sorted(f"skipped\0{q.path}\0{q.reason}" for q in listing.skipped),
            ])  # fmt: skip
        if self.path.is_file():
            return sha256_file(self.path)
        files = [f.as_posix() for f in list_folder(self.path).files]
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
                objects = self._objects().objects
                refuse_oversize(self.location, sum(o.size for o in objects), self.max_bytes)
                single_object = len(objects) == 1 and objects[0].key == parse_s3_uri(self.location).prefix
                download_s3(self.location, objects, scratch / ("download" if single_object else "files"))
                if not single_object:
                    yield OpenedSource(scratch / "files", list(self._objects().skipped))
                    return
                archive = scratch / "download" / objects[0].relative
            skipped = extract_archive(archive, scratch / "files", self.max_bytes)
            yield OpenedSource(scratch / "files", skipped)
