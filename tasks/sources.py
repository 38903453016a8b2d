"""Where Convert to Image Directory reads from: a folder, an archive, or an ``s3://bucket/prefix``.

Each source gives a content fingerprint (cheap where the store already knows one: S3 ETags) and opens as
a local folder to read: a folder is read in place; archives and S3 objects go to a temporary folder that
is removed afterwards. Archives are checked before anything is extracted: members outside the archive
(``../``, absolute paths), links pointing outside it and more declared bytes than ``max_extracted_bytes``
are refused with ``InvalidDatasetError``.

An opened folder is walked once (``list_folder``): links are followed only where they resolve inside the
folder; links leading out of it, broken links, link loops and anything that is not a regular file or folder
(FIFOs, sockets, devices) are skipped, each reported with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NoReturn

from tasks.errors import InvalidDatasetError
from tasks.fileio import sha256_file
from tasks.image_directory import MANIFEST_NAME, QuarantinedFile
from tasks.storage import is_s3_uri, parse_s3_uri, s3_client

DEFAULT_MAX_EXTRACTED_BYTES = 64 * 2**30
ARCHIVE_KINDS = ".zip, .tar, .tar.gz/.tgz, .tar.bz2, .tar.xz, or a .gz of a tar"
# An ImageDirectory given as a source is read as the class folders it is, without its manifest.
IGNORED_NAMES = frozenset({"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini", MANIFEST_NAME})
_DOWNLOAD_THREADS = 8


def visible(relative: PurePosixPath) -> bool:
    """False for hidden files and the litter of macOS and Windows, at any depth."""
    return not any(part.startswith(".") or part in IGNORED_NAMES for part in relative.parts)


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


def unsafe_member_name(name: str) -> bool:
    """An archive (or S3 key) name that would land outside the folder it is extracted to."""
    path = PurePosixPath(name.replace("\\", "/"))
    return path.is_absolute() or ".." in path.parts or (len(name) > 1 and name[1] == ":")


@dataclass
class OpenedSource:
    folder: Path
    skipped: list[QuarantinedFile] = field(default_factory=list)  # left behind while opening, with the reason


def _refuse_oversize(source: object, declared: int, limit: int) -> None:
    if declared > limit:
        raise InvalidDatasetError(
            f"{source} declares {declared:,} bytes of files, over the limit of {limit:,} bytes "
            "(max_extracted_bytes): refusing a possible archive bomb; raise the limit if the data is genuine"
        )


def _refuse_member(source: object, name: str, why: str) -> NoReturn:
    raise InvalidDatasetError(f"{source}: refusing archive member {name!r}: {why}; nothing was written to the output")


def _extract_zip(archive_path: Path, destination: Path, max_bytes: int) -> list[QuarantinedFile]:
    skipped = []
    with zipfile.ZipFile(archive_path) as archive:
        members = archive.infolist()
        _refuse_oversize(archive_path, sum(m.file_size for m in members), max_bytes)
        regular = []
        for member in members:
            if unsafe_member_name(member.filename):
                _refuse_member(archive_path, member.filename, "it points outside the archive")
            # Unix link flags live in the high 16 bits of external_attr; zipfile would write the target as text.
            if (member.external_attr >> 16) & 0o170000 == 0o120000:
                target = archive.read(member).decode("utf-8", "replace")
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(member.filename), target))
                if target.startswith(("/", "\\")) or target[1:2] == ":" or resolved.split("/")[0] == "..":
                    _refuse_member(archive_path, member.filename, f"it is a link to {target!r}, outside the archive")
                reason = f"symbolic link to {target!r}: links in zip archives are not followed"
                skipped.append(QuarantinedFile(path=member.filename, reason=reason))
                continue
            regular.append(member)
        # zipfile stops reading each member at its declared size, so the check above bounds what is written.
        archive.extractall(destination, members=regular)
    return skipped


def _extract_tar(archive_path: Path, destination: Path, max_bytes: int) -> None:
    extracted = 0

    def checked(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        nonlocal extracted
        if unsafe_member_name(member.name):
            _refuse_member(archive_path, member.name, "it points outside the archive")
        extracted += member.size if member.isfile() else 0
        _refuse_oversize(archive_path, extracted, max_bytes)
        # The stdlib "data" filter refuses links leading outside, device files and unsafe permissions.
        return tarfile.data_filter(member, path)

    with tarfile.open(archive_path, "r:*") as archive:
        try:
            archive.extractall(destination, filter=checked)
        except tarfile.FilterError as error:
            _refuse_member(archive_path, error.tarinfo.name, str(error))


def extract_archive(archive_path: Path, destination: Path, max_bytes: int) -> list[QuarantinedFile]:
    """Extract a .zip or (compressed) tar into ``destination``; the members skipped, with the reason."""
    destination.mkdir(parents=True, exist_ok=True)
    try:
        if zipfile.is_zipfile(archive_path):
            return _extract_zip(archive_path, destination, max_bytes)
        if tarfile.is_tarfile(archive_path):
            _extract_tar(archive_path, destination, max_bytes)
            return []
    except (zipfile.BadZipFile, tarfile.ReadError, EOFError, zlib.error) as error:
        raise InvalidDatasetError(f"{archive_path} is a damaged archive: {error}") from error
    except RuntimeError as error:  # zipfile's "File is encrypted, password required"
        raise InvalidDatasetError(f"{archive_path}: {error}") from error
    raise InvalidDatasetError(
        f"source {archive_path} is neither a folder nor an archive this stage reads ({ARCHIVE_KINDS})"
    )


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
            if not (self.path.is_dir() or self.path.is_file()):
                raise InvalidDatasetError(f"source {self.path} is neither a folder nor a regular file (an archive)")
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
                objects = self._objects()
                _refuse_oversize(self.location, sum(o.size for o in objects), self.max_bytes)
                single_object = len(objects) == 1 and objects[0].key == parse_s3_uri(self.location).prefix
                download_s3(self.location, objects, scratch / ("download" if single_object else "files"))
                if not single_object:
                    yield OpenedSource(scratch / "files")
                    return
                archive = scratch / "download" / objects[0].relative
            skipped = extract_archive(archive, scratch / "files", self.max_bytes)
            yield OpenedSource(scratch / "files", skipped)
