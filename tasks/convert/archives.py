"""Unpacking a .zip or (compressed) tar source: folders and regular files only, each path checked.

Members are written by this module, never by ``zipfile``/``tarfile`` extraction. Each name is split into
its components (backslashes too in a zip, where Windows tools write them), refused if it would leave the
destination, and created as a plain folder or file below it. Links are reported, never made: with no link
on disk, no chain of links can lead a later member outside, whatever the running Python's tarfile filters
get wrong (CVE-2025-4517 in 3.11.7's ``data`` filter). Contents are streamed in chunks counted against
``max_bytes``. A damaged archive is refused as such rather than read up to the damage.
"""

from __future__ import annotations

import errno
import lzma
import os
import posixpath
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO, NoReturn

from tasks.contracts.image_directory import QuarantinedFile
from tasks.errors import InvalidDatasetError

ARCHIVE_KINDS = ".zip, .tar, .tar.gz/.tgz, .tar.bz2, .tar.xz, or a .gz of a tar"
NAME_MAX = 255  # bytes in one path component on Linux and macOS file systems
_CHUNK = 1 << 20
_MAGIC = (
    (b"PK\x03\x04", "zip"),
    (b"PK\x05\x06", "zip"),  # an empty zip: its end record alone
    (b"\x1f\x8b", "gz"),
    (b"BZh", "bz2"),
    (b"\xfd7zXZ\x00", "xz"),
)
_SUFFIXES = {
    ".zip": "zip",
    ".tar": "tar",
    ".tgz": "gz",
    ".gz": "gz",
    ".tbz2": "bz2",
    ".bz2": "bz2",
    ".txz": "xz",
    ".xz": "xz",
}
_KIND_NAMES = {
    "zip": "zip",
    "tar": "tar",
    "gz": "gzip-compressed tar",
    "bz2": "bzip2-compressed tar",
    "xz": "xz-compressed tar",
}


def unsafe_member_name(name: str) -> bool:
    """An archive (or S3 key) name that would land outside the folder it is extracted to."""
    path = PurePosixPath(name.replace("\\", "/"))
    return path.is_absolute() or ".." in path.parts or (len(name) > 1 and name[1] == ":")


def refuse_oversize(source: object, size: int, limit: int, what: str = "declares") -> None:
    if size > limit:
        raise InvalidDatasetError(
            f"{source} {what} {size:,} bytes of files, over the limit of {limit:,} bytes "
            "(max_extracted_bytes): refusing a possible archive bomb; raise the limit if the data is genuine"
        )


def _refuse_member(source: object, name: str, why: str) -> NoReturn:
    raise InvalidDatasetError(f"{source}: refusing archive member {name!r}: {why}; nothing was written to the output")


def _relative(name: str, backslashes: bool = False) -> PurePosixPath:
    """The path a member name stands for, without empty or ``.`` components; in a zip, ``\\`` separates too."""
    text = name.replace("\\", "/") if backslashes else name
    return PurePosixPath(*[part for part in text.split("/") if part not in ("", ".")])


def archive_kind(path: Path) -> str | None:
    """'zip', 'tar', 'gz', 'bz2' or 'xz' from the first bytes, else from the name; None for neither."""
    with open(path, "rb") as handle:
        head = handle.read(512)
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head[257:262] == b"ustar":
        return "tar"
    if zipfile.is_zipfile(path):  # a zip behind a prefix, as self-extracting archives are
        return "zip"
    if tarfile.is_tarfile(path):  # pre-POSIX tars carry no magic
        return "tar"
    return _SUFFIXES.get(path.suffix.lower())


class _Writer:
    """Creates members below ``root``, refusing clashes (a path both a file and a folder) by what is on disk there:
    nothing is held per member but the links left out."""

    def __init__(self, source: Path, root: Path, max_bytes: int) -> None:
        self.source, self.root, self.max_bytes = source, root, max_bytes
        self.links: set[PurePosixPath] = set()  # links left out: nothing below them is written either
        self.skipped: list[QuarantinedFile] = []
        self.written = 0
        self._checked: PurePosixPath | None = None  # the last folder whose ancestors were found to be no file

    def path(self, name: str, backslashes: bool = False) -> PurePosixPath:
        if unsafe_member_name(name):
            _refuse_member(self.source, name, "it points outside the archive")
        path = _relative(name, backslashes)
        for part in path.parts:
            if len(os.fsencode(part)) > NAME_MAX:
                _refuse_member(
                    self.source,
                    name,
                    f"its name {part[:40]!r}… is {len(os.fsencode(part))} bytes long, over the "
                    f"{NAME_MAX} bytes a file system allows in one name: shorten it and pack the archive again",
                )
        return path

    def skip(self, name: str, reason: str) -> None:
        self.skipped.append(QuarantinedFile(path=name, reason=reason))

    def _claim(self, name: str, path: PurePosixPath, folder: bool) -> bool:
        """Whether ``path`` may be written as a folder or file; False (and reported) when it lies below a link left
        out; refused when it, or a folder above it, is already the other kind."""
        for ancestor in reversed(path.parents[:-1]):
            if ancestor in self.links:
                self.skip(name, f"lies below {ancestor.as_posix()!r}, a link that is not followed")
                return False
        if path.parent != self._checked:  # members come folder by folder: their ancestors are looked at once
            for ancestor in reversed(path.parents[:-1]):
                if (self.root / ancestor).is_file():
                    self._clash(name, ancestor)
            self._checked = path.parent
        target = self.root / path
        if target.is_file() or path in self.links if folder else target.is_dir():
            self._clash(name, path)
        self.links.discard(path)  # a later member replaces an earlier one of the same name, as tar does
        return True

    def _clash(self, name: str, path: PurePosixPath) -> NoReturn:
        _refuse_member(self.source, name, f"the archive holds {path.as_posix()!r} both as a file and as a folder")

    def folder(self, name: str, path: PurePosixPath) -> None:
        if path.parts and self._claim(name, path, folder=True):
            (self.root / path).mkdir(parents=True, exist_ok=True)

    def file(self, name: str, path: PurePosixPath, declared: int, open_member: Callable[[], IO[bytes]]) -> None:
        if not path.parts:
            _refuse_member(self.source, name, "it is a file without a name")
        if not self._claim(name, path, folder=False):
            return
        refuse_oversize(self.source, self.written + declared, self.max_bytes)
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with open_member() as member, open(target, "wb") as handle:
            while chunk := member.read(_CHUNK):
                self.written += len(chunk)
                refuse_oversize(self.source, self.written, self.max_bytes, "unpacks to at least")
                handle.write(chunk)

    def link(self, name: str, path: PurePosixPath, target: str, hard: bool) -> None:
        """Refuse a link leading outside the archive; report any other, creating nothing."""
        where = target if hard else posixpath.join(posixpath.dirname(name), target)
        if target.startswith(("/", "\\")) or target[1:2] == ":" or unsafe_member_name(posixpath.normpath(where)):
            _refuse_member(self.source, name, f"it is a link to {target!r}, outside the archive")
        linked = _relative(target)
        if hard and not ((self.root / linked).is_file() or linked in self.links):
            _refuse_member(
                self.source,
                name,
                f"it is a hard link to {target!r}, which no earlier member of the archive is: "
                "the archive is damaged or was cut from a larger one",
            )
        if self._claim(name, path, folder=False):
            self.links.add(path)
            kind = "hard link" if hard else "symbolic link"
            self.skip(name, f"{kind} to {target!r}: links in archives are not followed")


def _extract_zip(writer: _Writer, archive_path: Path) -> None:
    with zipfile.ZipFile(archive_path) as archive:
        members = archive.infolist()
        refuse_oversize(archive_path, sum(m.file_size for m in members), writer.max_bytes)
        for member in members:
            name = member.filename
            path = writer.path(name, backslashes=True)
            # Unix file types live in the high 16 bits of external_attr; 0 there for zips made elsewhere.
            kind = (member.external_attr >> 16) & 0o170000
            if kind == 0o120000:
                writer.link(name, path, archive.read(member).decode("utf-8", "replace"), hard=False)
            elif name.replace("\\", "/").endswith("/") or kind == 0o040000:
                writer.folder(name, path)
            elif kind in (0, 0o100000):
                writer.file(name, path, member.file_size, lambda m=member: archive.open(m))
            else:
                writer.skip(name, "not a regular file (a device or pipe): only files and folders are unpacked")


def _extract_tar(writer: _Writer, archive_path: Path, compression: str) -> None:
    with tarfile.open(archive_path, f"r:{compression}") as archive:
        count = 0  # members read, named if the archive turns out damaged after them
        for member in archive:
            count += 1
            archive.members.clear()  # tarfile keeps every member read; none is looked up again here
            path = writer.path(member.name)
            if member.issym() or member.islnk():
                writer.link(member.name, path, member.linkname, hard=member.islnk())
            elif member.isdir():
                writer.folder(member.name, path)
            elif member.isfile():
                writer.file(member.name, path, member.size, lambda m=member: archive.extractfile(m))
            else:
                writer.skip(member.name, "not a regular file (a device or pipe): only files and folders are unpacked")
        # tarfile ends the archive, without a word, at the first header it cannot read; only zeros (the end
        # blocks and their padding) may follow the end. Reading to the end also checks the compressed stream.
        while chunk := archive.fileobj.read(_CHUNK):
            if chunk.count(0) != len(chunk):
                raise InvalidDatasetError(
                    f"{archive_path} is a damaged archive: the header at byte {archive.offset:,} of the tar cannot "
                    f"be read (damaged, or a second archive after the end marker), yet data follows it; "
                    f"{count} members were read before it, the rest would be lost. Pack the archive again"
                )


def extract_archive(archive_path: Path, destination: Path, max_bytes: int) -> list[QuarantinedFile]:
    """Extract a .zip or (compressed) tar into ``destination``; the members skipped, with the reason."""
    kind = archive_kind(archive_path)
    if kind is None:
        raise InvalidDatasetError(
            f"source {archive_path} is neither a folder nor an archive this stage reads ({ARCHIVE_KINDS})"
        )
    destination.mkdir(parents=True, exist_ok=True)
    writer = _Writer(archive_path, destination, max_bytes)
    damaged = f"{archive_path} looks like a {_KIND_NAMES[kind]} archive but is damaged or truncated"
    try:
        if kind == "zip":
            _extract_zip(writer, archive_path)
        else:
            _extract_tar(writer, archive_path, "" if kind == "tar" else kind)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError) as error:
        raise InvalidDatasetError(f"{damaged}: {error}") from error
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise InvalidDatasetError(
                f"{archive_path}: a member's path is too long for this file system ({error.strerror}): "
                f"…{os.fsdecode(error.filename)[-120:]}; put its files in fewer, shorter folders"
            ) from error
        # gzip and bz2 report corrupt data as an OSError without errno; a full disk has one and is not the input's
        if error.errno is not None:
            raise
        raise InvalidDatasetError(f"{damaged}: {error}") from error
    except NotImplementedError as error:  # zipfile: a compression method it cannot read
        raise InvalidDatasetError(f"{archive_path}: {error}; re-pack it with deflate, bzip2 or lzma") from error
    except RuntimeError as error:  # zipfile's "File is encrypted, password required"
        raise InvalidDatasetError(f"{archive_path}: {error}") from error
    return writer.skipped
