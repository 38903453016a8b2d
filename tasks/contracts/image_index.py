"""The ImageDirectory's per-image records as columns: one uncompressed ``.npz`` at its root, memory-mapped.

``<root>/image_index.npz`` holds one array per column (N images, in the directory's order)::

    path.bytes, path.offsets                 uint8, int64 (N+1): the paths relative to the root, UTF-8; image i
                                             is bytes[offsets[i]:offsets[i + 1]]
    source_path.bytes, source_path.offsets   the user's name for each file, the same way ("" for none)
    label                                    int32: the class's position in the manifest's classes, -1 unlabeled
    sha256                                   uint8 (N, 32)
    size_bytes                               int64
    width, height                            int32, pixels
    mode                                     S8: Pillow mode ('L', 'RGB', ...)
    orientation                              int8: the source's EXIF orientation (1-8), applied when it was
                                             stored (1: stored as it was); absent from indexes written before
                                             2026-11-26, read as 0 (not recorded)
    perceptual_hash                          uint64: the stored image's 64-bit DCT perceptual hash
                                             (tasks.near_duplicates); 0: not hashed (under 32 pixels on a side;
                                             absent from indexes written before 2026-11-27, read as 0)

``numpy.load`` reads it as any ``.npz``. Its members are stored uncompressed, so each column is memory-mapped
where it lies in the file: a process holds no Python object per image, and the training ranks of a host share
the pages through the page cache. About 100 bytes an image on disk. A file at the root, not a folder, so that
tools that take every folder for a class (torchvision's ``ImageFolder``) still read the directory.

Written in one pass by ``index_writer.IndexWriter`` (bounded memory: rows are buffered and appended to raw column
files, which become the ``.npz`` at the end); ``ImageIndex.from_rows`` builds a small one in memory.
"""

from __future__ import annotations

import hashlib
import struct
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

import numpy as np

from tasks.storage.local_files import sha256_file

INDEX_NAME = "image_index.npz"
STRING_COLUMNS = ("path", "source_path")
FIXED_COLUMNS = {
    "label": np.dtype("<i4"),
    "sha256": np.dtype("u1"),
    "size_bytes": np.dtype("<i8"),
    "width": np.dtype("<i4"),
    "height": np.dtype("<i4"),
    "mode": np.dtype("S8"),
    "orientation": np.dtype("i1"),
    "perceptual_hash": np.dtype("<u8"),
}
# Columns added later: their value in an index written before them.
OPTIONAL_COLUMNS = {"orientation": 0, "perceptual_hash": 0}
CHUNK_ROWS = 65536  # rows handled at once where a column is walked in Python or re-laid out


class Row(NamedTuple):
    """One image's record, as the index stores it (``label``: a class position, -1 unlabeled)."""

    path: str
    source_path: str | None
    label: int
    sha256: str
    size_bytes: int
    width: int
    height: int
    mode: str
    orientation: int = 1
    perceptual_hash: int = 0


class Strings(Sequence[str]):
    """A column of UTF-8 strings: one byte array and N+1 offsets into it."""

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self.data, self.offsets = data, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return self.data[self.offsets[i] : self.offsets[i + 1]].tobytes().decode()

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), CHUNK_ROWS):
            offsets = self.offsets[start : start + CHUNK_ROWS + 1]
            blob, base = self.data[offsets[0] : offsets[-1]].tobytes(), int(offsets[0])
            ends = (offsets - base).tolist()
            yield from (blob[a:b].decode() for a, b in zip(ends, ends[1:]))

    def take(self, rows: np.ndarray) -> Strings:
        """The strings at ``rows``, in that order, as a new column in memory."""
        lengths = (self.offsets[1:] - self.offsets[:-1])[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        for begin in range(0, len(rows), CHUNK_ROWS):
            starts, counts = self.offsets[rows[begin : begin + CHUNK_ROWS]], lengths[begin : begin + CHUNK_ROWS]
            within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
            data[offsets[begin] : offsets[begin + len(counts)]] = self.data[np.repeat(starts, counts) + within]
        return Strings(data, offsets)

    def sorted_order(self) -> np.ndarray:
        """The positions in byte order of the strings (for UTF-8, the order of ``sorted`` on the str values)."""
        if len(self) == 0:
            return np.zeros(0, dtype=np.int64)
        width = int((self.offsets[1:] - self.offsets[:-1]).max()) or 1
        keys = np.zeros(len(self), dtype=f"S{width}")
        padded = keys.view(np.uint8).reshape(len(self), width)
        for start in range(0, len(self), CHUNK_ROWS):
            offsets = self.offsets[start : start + CHUNK_ROWS + 1]
            lengths = offsets[1:] - offsets[:-1]
            rows = np.repeat(np.arange(start, start + len(lengths)), lengths)
            columns = np.arange(int(offsets[-1] - offsets[0])) - np.repeat(offsets[:-1] - offsets[0], lengths)
            padded[rows, columns] = self.data[offsets[0] : offsets[-1]]
        return np.argsort(keys, kind="stable")


@dataclass(frozen=True)
class ImageIndex:
    """The columns of an ImageDirectory (see the module's docstring)."""

    path: Strings
    source_path: Strings
    label: np.ndarray
    sha256: np.ndarray
    size_bytes: np.ndarray
    width: np.ndarray
    height: np.ndarray
    mode: np.ndarray
    orientation: np.ndarray
    perceptual_hash: np.ndarray

    def __len__(self) -> int:
        return len(self.label)

    @classmethod
    def open(cls, path: Path) -> ImageIndex:
        """The index in ``path`` (an ``image_index.npz``), each column memory-mapped read-only."""
        columns = _mapped_members(path)
        for name, value in OPTIONAL_COLUMNS.items():
            if name not in columns:
                columns[name] = np.full(len(columns["label"]), value, dtype=FIXED_COLUMNS[name])

        def strings(name: str) -> Strings:
            return Strings(columns[f"{name}.bytes"], columns[f"{name}.offsets"])

        return cls(
            **{name: strings(name) for name in STRING_COLUMNS}, **{name: columns[name] for name in FIXED_COLUMNS}
        )

    @classmethod
    def from_rows(cls, rows: Iterable[Row]) -> ImageIndex:
        """A small index built in memory."""
        rows = list(rows)
        columns = list(zip(*rows)) if rows else [()] * len(Row._fields)
        data = dict(zip(Row._fields, columns))
        strings = {name: _strings([s or "" for s in data[name]]) for name in STRING_COLUMNS}
        fixed = {name: np.array(data[name], dtype=dtype) for name, dtype in FIXED_COLUMNS.items() if name != "sha256"}
        sha = np.frombuffer(b"".join(bytes.fromhex(h) for h in data["sha256"]), dtype=np.uint8).reshape(-1, 32)
        return cls(**strings, **fixed, sha256=sha)

    def row(self, i: int) -> Row:
        return Row(
            self.path[i],
            self.source_path[i] or None,
            int(self.label[i]),
            self.sha256[i].tobytes().hex(),
            int(self.size_bytes[i]),
            int(self.width[i]),
            int(self.height[i]),
            self.mode[i].decode(),
            int(self.orientation[i]),
            int(self.perceptual_hash[i]),
        )

    def take(self, rows: np.ndarray) -> ImageIndex:
        """The images at ``rows``, in that order, as a new index in memory."""
        rows = np.asarray(rows, dtype=np.int64)
        taken = {name: getattr(self, name).take(rows) for name in STRING_COLUMNS}
        return ImageIndex(**taken, **{name: np.asarray(getattr(self, name)[rows]) for name in FIXED_COLUMNS})

    def with_labels(self, labels: np.ndarray) -> ImageIndex:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return ImageIndex(**{**values, "label": np.asarray(labels, dtype=FIXED_COLUMNS["label"])})

    def columns(self) -> dict[str, np.ndarray]:
        arrays = {f"{n}.bytes": getattr(self, n).data for n in STRING_COLUMNS}
        arrays |= {f"{n}.offsets": getattr(self, n).offsets for n in STRING_COLUMNS}
        return arrays | {n: getattr(self, n) for n in FIXED_COLUMNS}

    def save(self, path: Path) -> str:
        """Write the index to ``path`` (an ``.npz``); returns the file's sha256."""
        return _save(path, self.columns())

    def content_hash(self, classes: Sequence[str]) -> str:
        """A digest of the labelled content, independent of the order: each image's path, class name (``None``
        when unlabeled) and sha256, in path order."""
        names = [*classes, "None"]  # label -1 picks the last
        digest = hashlib.sha256()
        order = self.path.sorted_order()
        for start in range(0, len(order), CHUNK_ROWS):
            rows = order[start : start + CHUNK_ROWS]
            paths = self.path.take(rows)
            hashes = self.sha256[rows]
            for path, label, sha in zip(paths, self.label[rows].tolist(), hashes):
                digest.update(content_line(path, names[label], sha.tobytes()))
        return digest.hexdigest()


def content_line(path: str, class_name: str, sha256: bytes) -> bytes:
    """One image's line of a content hash (label -1 names the class "None")."""
    return f"{path}\0{class_name}\0{sha256.hex()}\n".encode()


def _strings(values: Sequence[str]) -> Strings:
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return Strings(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets)


def _save(path: Path, columns: dict[str, np.ndarray]) -> str:
    # numpy writes each array into the zip in chunks, uncompressed (memory-mapped columns are not read whole).
    np.savez(path, **columns)
    return sha256_file(path)


def _mapped_members(path: Path) -> dict[str, np.ndarray]:
    """Each array of an uncompressed ``.npz``, memory-mapped where its data lies in the file."""
    arrays = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as handle:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"{info.filename} is compressed or not an array")
            handle.seek(info.header_offset)
            local = handle.read(30)
            name_length, extra_length = struct.unpack("<HH", local[26:30])
            handle.seek(info.header_offset + 30 + name_length + extra_length)
            version = np.lib.format.read_magic(handle)
            read_header = (
                np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(handle)
            if fortran or dtype.hasobject:
                raise ValueError(f"{info.filename} is not a plain C-ordered array")
            name = info.filename.removesuffix(".npy")
            if int(np.prod(shape)) == 0:
                arrays[name] = np.zeros(shape, dtype)
            else:
                arrays[name] = np.memmap(path, dtype=dtype, mode="r", offset=handle.tell(), shape=shape)
    expected = {f"{n}.{part}" for n in STRING_COLUMNS for part in ("bytes", "offsets")} | set(FIXED_COLUMNS)
    expected -= set(OPTIONAL_COLUMNS)
    if missing := expected - arrays.keys():
        raise ValueError(f"no {', '.join(sorted(missing))} in it")
    return arrays
