"""Writing an ImageDirectory's index (``image_index.npz``, the columns of ``image_index.py``) in one pass with
bounded memory."""

from __future__ import annotations

import hashlib
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tasks.contracts.image_index import (
    CHUNK_ROWS,
    FIXED_COLUMNS,
    STRING_COLUMNS,
    ImageIndex,
    Row,
    Strings,
    content_line,
)
from tasks.storage.local_files import sha256_file

_HASHED_ROWS = 4096  # rows hashed at once as an index is written (a Python object each while they are)


class IndexWriter:
    """Writes an index row by row with bounded memory: rows are buffered and appended to raw column files (in a
    scratch folder beside it), which ``finish`` turns into the ``.npz``. ``relabel``, when set, maps each label
    on the way (``relabel[old] = new``; -1 stays)."""

    _BUFFER = 4096

    def __init__(self, path: Path) -> None:
        self.path, self.scratch = path, path.with_name(f".{path.name}.rows")
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch.mkdir(parents=True)
        self._flushed = 0
        self.relabel: np.ndarray | None = None
        self._rows: list[Row] = []
        self._last_path: bytes | None = None
        self.in_path_order = True  # each row's path after the one before, as bytes: hashed without sorting
        self._string_bytes = dict.fromkeys(STRING_COLUMNS, 0)
        self._raw = {name: open(self.scratch / name, "wb") for name in self._raw_names()}  # noqa: SIM115
        for name in STRING_COLUMNS:  # offsets start at 0; each row appends its string's end
            self._raw[f"{name}.offsets"].write(np.zeros(1, dtype="<i8").tobytes())

    @staticmethod
    def _raw_names() -> list[str]:
        return [*(f"{n}.bytes" for n in STRING_COLUMNS), *(f"{n}.offsets" for n in STRING_COLUMNS), *FIXED_COLUMNS]

    @property
    def count(self) -> int:
        """Rows appended so far."""
        return self._flushed + len(self._rows)

    def append(self, row: Row) -> None:
        path = row.path.encode()
        if self._last_path is not None and path <= self._last_path:
            self.in_path_order = False
        self._last_path = path
        self._rows.append(row)
        if len(self._rows) >= self._BUFFER:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        chunk = ImageIndex.from_rows(self._rows)
        for name in STRING_COLUMNS:
            strings: Strings = getattr(chunk, name)
            self._raw[f"{name}.bytes"].write(strings.data.tobytes())
            ends = strings.offsets[1:] + self._string_bytes[name]
            self._raw[f"{name}.offsets"].write(ends.astype("<i8").tobytes())
            self._string_bytes[name] += int(strings.offsets[-1])
        for name in FIXED_COLUMNS:
            self._raw[name].write(np.ascontiguousarray(getattr(chunk, name)).tobytes())
        self._flushed += len(self._rows)
        self._rows = []

    def finish(self, classes: Sequence[str] | None = None) -> tuple[str, str | None]:
        """Write the ``.npz``, each column copied from its raw file a chunk at a time (nothing is read whole or
        memory-mapped), and remove the scratch folder. Returns the file's sha256 and, given the ``classes``, the
        content hash (``ImageIndex.content_hash``) when the rows came in path order (else None: hash the index)."""
        self._flush()
        self.close()
        with zipfile.ZipFile(self.path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name in self._raw_names():
                raw = self.scratch / name
                dtype = self._dtype(name)
                shape = (self.count, 32) if name == "sha256" else (raw.stat().st_size // dtype.itemsize,)
                header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
                with archive.open(f"{name}.npy", "w", force_zip64=True) as out, open(raw, "rb") as source:
                    np.lib.format.write_array_header_1_0(out, header)
                    while chunk := source.read(CHUNK_ROWS * dtype.itemsize):
                        out.write(self._relabelled(chunk) if name == "label" else chunk)
        content = self._content_hash(classes) if classes is not None and self.in_path_order else None
        shutil.rmtree(self.scratch)
        return sha256_file(self.path), content

    @staticmethod
    def _dtype(name: str) -> np.dtype:
        return np.dtype("<i8") if name.endswith(".offsets") else FIXED_COLUMNS.get(name, np.dtype("u1"))

    def _relabelled(self, chunk: bytes) -> bytes:
        if self.relabel is None or not len(self.relabel):
            return chunk
        values = np.frombuffer(chunk, dtype=FIXED_COLUMNS["label"])
        return (
            np.where(values >= 0, self.relabel[np.maximum(values, 0)], values).astype(FIXED_COLUMNS["label"]).tobytes()
        )

    def _content_hash(self, classes: Sequence[str]) -> str:
        """``ImageIndex.content_hash`` of rows written in path order, read back from the raw files in chunks."""
        names, digest = [*classes, "None"], hashlib.sha256()
        raw = {n: open(self.scratch / n, "rb") for n in ("path.bytes", "path.offsets", "label", "sha256")}  # noqa: SIM115
        try:
            for start in range(0, self.count, _HASHED_ROWS):
                rows = min(_HASHED_ROWS, self.count - start)
                raw["path.offsets"].seek(start * 8)
                offsets = np.frombuffer(raw["path.offsets"].read((rows + 1) * 8), dtype="<i8")
                raw["path.bytes"].seek(int(offsets[0]))
                data = raw["path.bytes"].read(int(offsets[-1] - offsets[0]))
                labels = raw["label"].read(rows * 4)
                labels = np.frombuffer(self._relabelled(labels), "<i4")
                hashes = raw["sha256"].read(rows * 32)
                ends = (offsets - offsets[0]).tolist()
                for i, label in enumerate(labels.tolist()):
                    path = data[ends[i] : ends[i + 1]].decode()
                    digest.update(content_line(path, names[label], hashes[32 * i : 32 * i + 32]))
        finally:
            for handle in raw.values():
                handle.close()
        return digest.hexdigest()

    def close(self) -> None:
        """Close the raw files (``finish`` does; a caller stopping without finishing removes the scratch folder).
        Rows still buffered that the storage cannot take are dropped, not raised: the scratch is only this
        attempt's (a later one starts it afresh), and the caller is already stopping on the storage's fault."""
        for handle in self._raw.values():
            try:
                handle.close()
            except OSError:
                pass
