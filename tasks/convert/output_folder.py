"""Where a conversion writes, so that one stopped goes on.

- The ``.<output>.partial-<hash>`` folder it fills beside the output (``resumable_folder``): renamed over the
  output on success; kept when the storage stops it, or it is interrupted. An output already converted from the
  same content and settings is reused (``converted_before``).
- Every write there goes through ``writing()``, so that a fault of its storage (one of ``STORAGE_ERRNOS``) is the
  storage's (``WriteFailed``, then the one ``OutputStorageError`` of ``storage_error``: the whole conversion
  stops), never an image's.
- The folder's journal (``.stored.jsonl``, one ImageRecord a line, ``StoredJournal``): an image is recorded only
  once it is written and checked; the next attempt with the same settings trusts what the journal names and
  stores only the rest."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import threading
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tasks.contracts.image_directory import ImageDirectory, ImageRecord
from tasks.convert.plan import SourceFile
from tasks.errors import InvalidDatasetError, OutputStorageError
from tasks.storage.local_files import STORAGE_ERRNOS, megabytes

JOURNAL_NAME = ".stored.jsonl"


class WriteFailed(Exception):
    """Writing the output failed (``error``: the OSError): the whole conversion stops."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """Around a write to the output: a storage fault there is the storage's, never the image's."""
    try:
        yield
    except OSError as error:
        if error.errno in STORAGE_ERRNOS:
            raise WriteFailed(error) from error
        raise


def _key(path: str) -> np.uint64:
    return np.uint64(int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "little"))


class StoredJournal:
    """The images a conversion's folder holds complete and checked: one ImageRecord a line, appended as each is
    stored.

    Opened on a folder an earlier attempt left, it keeps the images its journal names (present, with the size
    recorded) and deletes every other file there: one being written or checked when that attempt stopped. Of those
    records it holds only where each lies in the journal, by a hash of its path (33 bytes an image, in arrays: a
    million stored before an interruption take 33 MB), and reads one back when its image comes up again."""

    def __init__(self, root: Path) -> None:
        self.root, self.path = root, root / JOURNAL_NAME
        self._lock = threading.Lock()
        self.images = 0  # stored in all, by the earlier attempts and this one
        self.attempt_bytes = self.source_bytes = 0  # the images this attempt stored or reused, and their sources
        self._handle = None  # appended to, unbuffered: each record one write
        self._reader: int | None = None  # the journal opened for reading earlier records back
        # An earlier attempt's records, sorted by their path's hash: where each line is, its image's size, and
        # whether this attempt has yet to reach it.
        self._keys = np.zeros(0, np.uint64)
        self._offsets = self._lengths = self._sizes = np.zeros(0, np.int64)
        self._waiting = np.zeros(0, bool)
        if self.path.is_file():
            self._read_earlier()

    def _read_earlier(self) -> None:
        keys, offsets, lengths, sizes = array("Q"), array("q"), array("q"), array("q")
        with open(self.path, "rb") as handle:
            end = 0
            for line in handle:
                start, end = end, end + len(line)
                with contextlib.suppress(ValueError):  # a blank line, or the one being written when it stopped
                    record = ImageRecord.model_validate_json(line)
                    stored = self.root / record.path
                    if stored.is_file() and stored.stat().st_size == record.size_bytes:
                        keys.append(int(_key(record.path)))
                        offsets.append(start)
                        lengths.append(len(line))
                        sizes.append(record.size_bytes)
        all_keys = np.frombuffer(keys, dtype=np.uint64) if keys else np.zeros(0, np.uint64)
        order = np.lexsort((np.arange(len(all_keys)), all_keys))  # by path, then line: a path's last line wins
        last = order[np.append(all_keys[order][1:] != all_keys[order][:-1], True)] if len(order) else order
        self._keys = all_keys[last]
        self._offsets, self._lengths, self._sizes = (
            np.asarray(a, dtype=np.int64)[last] for a in (offsets, lengths, sizes)
        )
        self._waiting = np.ones(len(last), dtype=bool)
        self._reader = os.open(self.path, os.O_RDONLY)
        for path in self.root.rglob("*"):
            if path.is_file() and path != self.path and self._find(path.relative_to(self.root).as_posix()) is None:
                path.unlink()
        self.images = len(last)

    def _find(self, target: str) -> tuple[int, ImageRecord] | None:
        """Where an earlier attempt's record of ``target`` is, and the record, if it has one not yet reached."""
        key = _key(target)
        for i in range(np.searchsorted(self._keys, key, "left"), np.searchsorted(self._keys, key, "right")):
            if self._waiting[i]:
                line = os.pread(self._reader, int(self._lengths[i]), int(self._offsets[i]))
                if (record := ImageRecord.model_validate_json(line)).path == target:
                    return i, record
        return None

    @property
    def reusable(self) -> int:
        """How many images an earlier attempt stored that this one has yet to reach."""
        return int(self._waiting.sum())

    @property
    def stored_bytes(self) -> int:
        """The bytes of the images an earlier attempt stored, not reached yet by this one."""
        return int(self._sizes[self._waiting].sum())

    def take(self, file: SourceFile, target: str) -> ImageRecord | None:
        """The record of ``file`` when an earlier attempt stored it at ``target`` (it stays counted); another
        file's stored there, planned otherwise this time, is deleted, for this one to be stored afresh."""
        if (found := self._find(target)) is None:
            return None
        at, record = found
        with self._lock:
            self._waiting[at] = False
        if (record.source_path, record.label) != (file.original.as_posix(), file.label):
            (self.root / target).unlink()
            with self._lock:
                self.images -= 1
            return None
        with self._lock:
            self.attempt_bytes += record.size_bytes
            self.source_bytes += file.size()
        return record

    def add(self, record: ImageRecord, source_bytes: int) -> None:
        # Each record starts on a line of its own, in one write: a line cut short by a full disk spoils only itself.
        line = ("\n" + record.model_dump_json()).encode()
        with self._lock, writing():
            if self._handle is None:
                self._handle = open(self.path, "ab", buffering=0)  # noqa: SIM115 (closed by close or remove)
            self._handle.write(line)
            self.images += 1
            self.attempt_bytes += record.size_bytes
            self.source_bytes += source_bytes

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None
            if self._reader is not None:
                os.close(self._reader)
                self._reader = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


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
