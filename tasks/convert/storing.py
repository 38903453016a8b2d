"""Checking and storing one image of a conversion, and telling whose fault a failure is.

A failure is the image's (quarantined with the reason: damaged, not an image, too many pixels), the source's
storage's (the file cannot be read: quarantined as "unreadable file" with its errno) or the output's storage's
(a write fails with one of ``STORAGE_ERRNOS``): ``WriteFailed``, which stops the whole conversion, since every
later image would fail the same way and none of them is to blame. Pillow's own decode errors carry no errno.

Each image is written with an exclusive create, checked, and only then recorded in the folder's journal
(``output_folder.StoredJournal``), which lets a conversion stopped by its storage go on where it stopped.

Images are stored as every viewer shows them: one with an EXIF orientation other than 1 (a phone's portrait photo,
stored sideways with the tag) is turned upright and re-encoded in its own format, losslessly where the format
allows (PNG, WebP lossless, TIFF) and for JPEG with the original's quantisation tables and chroma subsampling, the
orientation recorded (``ImageRecord.orientation``). HEIC/HEIF (``pillow-heif``) and AVIF are stored as JPEG
(quality 95, RGB), which every decode path reads, nvJPEG included. Every other image is a byte-for-byte copy.

Each stored image's perceptual hash (``tasks.near_duplicates``) is read off the pixels decoded here anyway (a JPEG's
1/8-scale decode), upright, so that the split can keep near-duplicates together without decoding again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from PIL import Image, ImageOps, JpegImagePlugin, UnidentifiedImageError

from tasks.contracts.image_directory import (
    REENCODED_AS_JPEG,
    ImageRecord,
    Normalisation,
    QuarantinedFile,
    orientation_of,
)
from tasks.contracts.image_files import HEIF_READER
from tasks.convert.output_folder import StoredJournal, WriteFailed, writing
from tasks.convert.plan import SourceFile
from tasks.near_duplicates import MIN_SIDE, perceptual_hash
from tasks.storage.local_files import sha256_file

# Pillow holds RGB as 4 bytes a pixel; normalising adds the rotated and the converted copy.
_BYTES_PER_PIXEL, _NORMALISING_BYTES_PER_PIXEL = 4, 12
_CHUNK = 1 << 20
# Files up to this size are read once and checked, written, decoded and hashed from memory (two opens an image
# instead of six); larger ones are streamed.
_IN_MEMORY_BYTES = 64 << 20
# Formats whose encoder would otherwise pick a low default quality when re-encoding a normalised image.
_SAVE_OPTIONS = {"JPEG": {"quality": 95}, "WEBP": {"quality": 95}}


class DecodeBudget:
    """Bytes of decoded pixels all threads may hold at once; an image larger than the whole budget runs alone."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self._changed = threading.Condition()

    @contextlib.contextmanager
    def hold(self, amount: int) -> Iterator[None]:
        amount = min(amount, self.limit)
        with self._changed:
            self._changed.wait_for(lambda: self.held + amount <= self.limit)
            self.held += amount
        try:
            yield
        finally:
            with self._changed:
                self.held -= amount
                self._changed.notify_all()


@dataclass(frozen=True)
class StoreSettings:
    normalisation: Normalisation | None
    max_pixels: int
    budget: DecodeBudget
    made_folders: set[Path] = field(default_factory=set)  # the output's folders made so far (one mkdir each)


class _Refused(Exception):
    """An image that is quarantined, with the reason."""


class _Empty(Exception):
    """A file of 0 bytes."""


# Reading a source, these make it unreadable (quarantined as such); writing the output, any of STORAGE_ERRNOS
# stops the whole conversion (OutputStorageError): a fault of the storage is never taken for a damaged image.
_UNREADABLE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EIO}


def space_needed(size: int, normalisation: Normalisation | None) -> int:
    """About how many bytes an image of ``size`` bytes takes stored: its size (copied byte for byte), capped when
    normalising to a longest side at 4 bytes a pixel of the largest image that side allows."""
    if normalisation is not None and normalisation.max_side:
        return min(size, normalisation.max_side**2 * 4)
    return size


def _check_pixels(image: Image.Image, max_pixels: int) -> None:
    if image.width * image.height > max_pixels:
        raise _Refused(
            f"{image.width}x{image.height} pixels ({image.width * image.height:,}), over the limit of "
            f"{max_pixels:,} (max_image_pixels)"
        )


def _copy_exclusively(source: Path, destination: Path) -> None:
    """Stream ``source`` to a new file: FileExistsError rather than overwrite what another image stored."""
    with open(source, "rb") as reader:  # a fault reading the source is the source's (quarantined as unreadable)
        with writing():
            writer = open(destination, "xb")  # noqa: SIM115 (closed below, a fault closing it being the output's)
        try:
            while chunk := reader.read(_CHUNK):
                with writing():
                    writer.write(chunk)
        finally:
            with writing():
                writer.close()


def _read_small(path: Path) -> bytes | None:
    """The file's bytes, when it is small enough to hold (``_IN_MEMORY_BYTES``); else None."""
    with open(path, "rb") as reader:  # a fault reading the source is the source's (quarantined as unreadable)
        if os.fstat(reader.fileno()).st_size > _IN_MEMORY_BYTES:
            return None
        return reader.read()


def _make_folder(folder: Path, settings: StoreSettings) -> None:
    if folder not in settings.made_folders:
        with writing():
            folder.mkdir(parents=True, exist_ok=True)
        settings.made_folders.add(folder)


class Stored(NamedTuple):
    """What was stored of one image (named as in ImageRecord)."""

    width: int
    height: int
    mode: str
    sha256: str
    size_bytes: int
    orientation: int = 1
    perceptual_hash: int = 0


def _reencoding(source: Image.Image, upright: Image.Image) -> tuple[Image.Image, str, dict]:
    """(the image to save, its format, the save options) for an upright copy of ``source`` in its own format, or
    as JPEG for the formats not every decode path reads (HEIC, AVIF); metadata kept, the orientation tag dropped
    (``exif_transpose`` removes it from ``upright``)."""
    metadata = {key: upright.info[key] for key in ("exif", "icc_profile") if upright.info.get(key)}
    fmt = source.format or "PNG"
    if fmt in ("JPEG", "MPO"):
        options = {"qtables": source.quantization}
        if (sampling := JpegImagePlugin.get_sampling(source)) >= 0:
            options["subsampling"] = sampling
        return (
            upright.convert("RGB") if upright.mode not in ("RGB", "L", "CMYK") else upright,
            "JPEG",
            metadata | options,
        )
    if fmt.upper() in REENCODED_AS_JPEG:
        return upright.convert("RGB"), "JPEG", metadata | {"quality": 95}
    if fmt == "WEBP":
        return upright, fmt, metadata | {"lossless": True}
    return upright, fmt, metadata


def _store_upright(image: Image.Image, destination: Path, settings: StoreSettings, orientation: int) -> Stored:
    """Decode ``image`` whole (damage shows), turn it upright and write it re-encoded (``_reencoding``)."""
    with settings.budget.hold(image.width * image.height * _NORMALISING_BYTES_PER_PIXEL):
        image.load()
        result, fmt, options = _reencoding(image, ImageOps.exif_transpose(image))
        buffer = io.BytesIO()
        result.save(buffer, format=fmt, **options)
        fingerprint = perceptual_hash(result)
    data = buffer.getvalue()
    with writing(), open(destination, "xb") as writer:
        writer.write(data)
    return Stored(*result.size, result.mode, hashlib.sha256(data).hexdigest(), len(data), orientation, fingerprint)


def _needs_reencoding(image: Image.Image) -> int | None:
    """The orientation to store ``image`` upright with, when it cannot be a byte-for-byte copy; else None."""
    orientation = orientation_of(image)
    if orientation != 1 or (image.format or "").upper() in REENCODED_AS_JPEG:
        return orientation
    return None


def _decode(image: Image.Image, settings: StoreSettings, sha256: str, size_bytes: int) -> Stored:
    """Decode ``image`` in full (truncation and damage only show then): what is stored of it (``image`` is stored
    as it is, with the given sha256 and size)."""
    size, mode = image.size, image.mode
    # A JPEG drafted to 1/8 scale is still entropy-decoded to its last byte, so truncation and damage
    # still show, but most of the IDCT and colour conversion (needed only to re-encode) is skipped; no smaller
    # than twice the perceptual hash's least side, which it is read off.
    image.draft(None, (2 * MIN_SIDE, 2 * MIN_SIDE))
    with settings.budget.hold(image.width * image.height * _BYTES_PER_PIXEL):
        image.load()
        fingerprint = perceptual_hash(image)
    return Stored(*size, mode, sha256, size_bytes, perceptual_hash=fingerprint)


def _store_bytes(data: bytes, destination: Path, settings: StoreSettings) -> Stored:
    """Check ``data`` from its header, write it, then decode it: what is decoded and hashed are the very bytes
    stored, whatever the source does meanwhile."""
    with Image.open(io.BytesIO(data)) as image:  # the header only: a huge or hostile file is refused before any decode
        _check_pixels(image, settings.max_pixels)
        if (orientation := _needs_reencoding(image)) is not None:
            return _store_upright(image, destination, settings, orientation)
        with writing(), open(destination, "xb") as writer:
            writer.write(data)
        return _decode(image, settings, hashlib.sha256(data).hexdigest(), len(data))


def _store(file: SourceFile, destination: Path, settings: StoreSettings) -> Stored:
    """Write one checked image to ``destination``: what was stored."""
    data = _read_small(file.path) if settings.normalisation is None else None
    if (len(data) if data is not None else file.size()) == 0:
        raise _Empty
    _make_folder(destination.parent, settings)
    if data is not None:
        return _store_bytes(data, destination, settings)
    with Image.open(file.path) as image:  # the header only: a huge or hostile file is refused before any read
        _check_pixels(image, settings.max_pixels)
        normalisation = settings.normalisation
        if normalisation is not None:
            with settings.budget.hold(image.width * image.height * _NORMALISING_BYTES_PER_PIXEL):
                orientation = orientation_of(image)
                image.load()
                fmt = "JPEG" if (image.format or "").upper() in REENCODED_AS_JPEG else image.format
                result = ImageOps.exif_transpose(image).convert(normalisation.mode)
                if normalisation.max_side and max(result.size) > normalisation.max_side:
                    result.thumbnail((normalisation.max_side, normalisation.max_side), Image.Resampling.LANCZOS)
                with writing(), open(destination, "xb") as writer:
                    result.save(writer, format=fmt, **_SAVE_OPTIONS.get(fmt, {}))
                size = destination.stat().st_size
                fingerprint = perceptual_hash(result)
                return Stored(*result.size, result.mode, sha256_file(destination), size, orientation, fingerprint)
        if (orientation := _needs_reencoding(image)) is not None:  # too large to hold, yet not to be copied
            return _store_upright(image, destination, settings, orientation)
    # A large file is streamed: the copy is what gets decoded and hashed.
    _copy_exclusively(file.path, destination)
    with Image.open(destination) as image:
        _check_pixels(image, settings.max_pixels)
        return _decode(image, settings, sha256_file(destination), destination.stat().st_size)


def store_image(file: SourceFile, target: str, root: Path, settings: StoreSettings) -> ImageRecord | QuarantinedFile:
    """Check one image and write it to ``root / target`` (a POSIX path): an ImageRecord, or why it was
    quarantined."""
    where = file.original.as_posix()
    destination = root / target
    try:
        stored = _store(file, destination, settings)
    except FileExistsError:
        raise  # two images planned to one path: a bug to surface, never a file to overwrite or quarantine
    except WriteFailed:
        destination.unlink(missing_ok=True)
        raise  # the storage's fault: the conversion stops (convert_to_image_directory says where and how much)
    except _Empty:
        return QuarantinedFile(path=where, reason="empty file (0 bytes)")
    except _Refused as refused:
        reason = str(refused)
    except Image.DecompressionBombError as error:
        reason = f"over Pillow's decompression-bomb guard: {error}"
    except UnidentifiedImageError:
        heif = Path(where).suffix.lower() in (".heic", ".heif")
        reason = HEIF_READER if heif and HEIF_READER else "not an image: Pillow cannot identify the file's format"
    except OSError as error:
        if error.errno in _UNREADABLE_ERRNOS and getattr(error, "filename", None) not in (None, str(destination)):
            reason = f"unreadable file: [Errno {error.errno}] {error.strerror}"
        else:
            reason = f"damaged or truncated image: {error}"
    except (SyntaxError, ValueError, EOFError) as error:
        reason = f"damaged or truncated image: {error}"
    else:
        return ImageRecord(path=target, label=file.label, source_path=where, **stored._asdict())
    destination.unlink(missing_ok=True)  # this call created it (exclusively), or nothing is there
    return QuarantinedFile(path=where, reason=reason)


class ImageWriter:
    """``store_image`` for each planned image, from many threads: an image the journal holds is reused, and after
    the first fault of the output's storage every image not yet begun is left (None) and the fault re-raised."""

    def __init__(self, root: Path, settings: StoreSettings, journal: StoredJournal) -> None:
        self.root, self.settings, self.journal = root, settings, journal
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.counts = {"stored": 0, "reused": 0, "quarantined": 0}  # so far, for the progress line

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def __call__(self, file: SourceFile, target: str) -> ImageRecord | QuarantinedFile | None:
        if (record := self.journal.take(file, target)) is not None:
            self._count("reused")
            return record
        if self._stopped.is_set():
            return None  # another image could not be written: the conversion is stopping
        try:
            result = store_image(file, target, self.root, self.settings)
            if isinstance(result, ImageRecord):
                self.journal.add(result, file.size())
            self._count("stored" if isinstance(result, ImageRecord) else "quarantined")
            return result
        except WriteFailed:
            self._stopped.set()
            raise
