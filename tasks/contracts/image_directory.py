"""The ImageDirectory contract: what `convert` writes and every later stage reads.

Layout::

    <root>/image_directory.json          the manifest: classes, counts, source, settings, warnings (``image_manifest``)
    <root>/image_index.npz               one record per image, as memory-mapped columns (``tasks.contracts.image_index``)
    <root>/<class folder>/<image file>   labeled directories (one folder per class, see ``image_files.class_folders``)
    <root>/<image file>                  unlabeled directories (for scoring; sub-folders of the source are kept)

Class indices are positions in ``classes``. Later stages read images through ``ImageDirectory.samples()``; none
of them walks raw sources again. The manifest is written last (``ImageDirectory.write``): a directory with a
manifest is complete. A format 1 directory (its records in the JSON) still opens, its records read into an index
in memory.

One concern a file: image_files.py (which files are images, their stored names and orientation), image_manifest.py
(the manifest's schema), this module (the directory on disk). Every name of the three is importable from here.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from tasks.contracts.image_files import (
    EXIF_ORIENTATION,
    IMAGE_EXTENSIONS,
    REENCODED_AS_JPEG,
    class_folders,
    orientation_of,
    safe_name,
    stored_file_name,
)
from tasks.contracts.image_index import INDEX_NAME, ImageIndex, Row
from tasks.contracts.image_manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    ImageDirectoryManifest,
    ImageRecord,
    Normalisation,
    QuarantinedFile,
    SplitRecord,
)
from tasks.contracts.index_writer import IndexWriter
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import write_text_atomic

# The stages import the whole contract from here: the files' rules (image_files.py) and the manifest's schema
# (image_manifest.py) with the directory that holds them.
__all__ = [
    "EXIF_ORIENTATION",
    "FORMAT_VERSION",
    "IMAGE_EXTENSIONS",
    "INDEX_NAME",
    "LABELLED_FOLDER",
    "MANIFEST_NAME",
    "REENCODED_AS_JPEG",
    "ImageDirectory",
    "ImageDirectoryManifest",
    "ImageRecord",
    "ImageSamples",
    "Normalisation",
    "QuarantinedFile",
    "SplitRecord",
    "class_folders",
    "index_rows",
    "orientation_of",
    "safe_name",
    "stored_file_name",
]

# Inside a class folder: where a labelled batch's images go, + the first 12 hex digits of the batch's content hash
# (tasks/monitoring/labelled.py writes them; training draws them more often, TrainingParams.labelled_share).
LABELLED_FOLDER = "labelled-"
_IN_A_LABELLED_BATCH = re.compile(rf"(^|/){LABELLED_FOLDER}[0-9a-f]{{12}}/").search


def index_rows(records: Iterable[ImageRecord], classes: Sequence[str]) -> Iterator[Row]:
    """ImageRecords as index rows (labels as positions in ``classes``)."""
    position = {name: i for i, name in enumerate(classes)}
    for r in records:
        label = -1 if r.label is None else position[r.label]
        yield Row(
            r.path,
            r.source_path,
            label,
            r.sha256,
            r.size_bytes,
            r.width,
            r.height,
            r.mode,
            r.orientation,
            r.perceptual_hash,
        )


class ImageSamples(Sequence[tuple[Path, int]]):
    """(absolute image path, class index) per image of index rows ``start`` to ``stop`` (all by default), read from
    the index on demand (-1 when unlabeled)."""

    def __init__(self, root: Path, index: ImageIndex, start: int = 0, stop: int | None = None) -> None:
        self.root, self.paths, self.labels = root, index.path, index.label
        self.start, self.stop = start, len(index.label) if stop is None else stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i = self.start + i % len(self)
        return self.root / self.paths[i], int(self.labels[i])

    def __iter__(self) -> Iterator[tuple[Path, int]]:
        whole = (self.start, self.stop) == (0, len(self.labels))
        paths = self.paths if whole else (self.paths[i] for i in range(self.start, self.stop))
        return zip((self.root / p for p in paths), self.labels[self.start : self.stop].tolist())


class ImageDirectory:
    """A converted image directory on local disk: its manifest, and its index opened on first use."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        manifest_path = self.root / MANIFEST_NAME
        if not manifest_path.is_file():
            raise InvalidDatasetError(
                f"{self.root} is not an ImageDirectory: {MANIFEST_NAME} is missing. "
                "Run the convert stage (from flows import convert_to_image_directory) on your images first."
            )
        data = json.loads(manifest_path.read_bytes())
        self._index: ImageIndex | None = None
        version = data.get("format_version", 1) if isinstance(data, dict) else None
        if version == 1 and isinstance(data.get("images"), list):
            # Format 1 (records in the JSON): read them into an index in memory.
            records = [ImageRecord.model_validate(r) for r in data.pop("images")]
            self._index = ImageIndex.from_rows(index_rows(records, data["classes"]))
            data |= {"image_count": len(records), "content_hash": self._index.content_hash(data["classes"])}
        elif version != FORMAT_VERSION:
            raise InvalidDatasetError(
                f"{manifest_path} is in format {version!r}; this version reads formats 1 and {FORMAT_VERSION}: "
                "convert the images again with this version (from flows import convert_to_image_directory)"
            )
        self.manifest = ImageDirectoryManifest.model_validate(data)

    @property
    def index(self) -> ImageIndex:
        """The images' records (memory-mapped columns)."""
        if self._index is None:
            path = self.root / INDEX_NAME
            try:
                index = ImageIndex.open(path)
            except (OSError, ValueError, zipfile.BadZipFile) as error:
                raise InvalidDatasetError(
                    f"{self.root}: its index {path} cannot be read ({error}): convert the images again"
                ) from None
            if len(index) != self.manifest.image_count:
                raise InvalidDatasetError(
                    f"{self.root}: its index holds {len(index)} images, its manifest {self.manifest.image_count}: "
                    "convert the images again"
                )
            self._index = index
        return self._index

    @classmethod
    def write(
        cls, root: Path, manifest: ImageDirectoryManifest, index: ImageIndex | IndexWriter | Iterable[ImageRecord]
    ) -> None:
        """Write ``index`` (an index, a writer to finish, or records) and then the manifest, with the image count,
        the content hash and the index's sha256 filled in."""
        path = root / INDEX_NAME
        if isinstance(index, IndexWriter):
            digest, content_hash = index.finish(manifest.classes)
        else:
            if not isinstance(index, ImageIndex):
                index = ImageIndex.from_rows(index_rows(index, manifest.classes))
            digest, content_hash = index.save(path), None
        written = ImageIndex.open(path)
        manifest = manifest.model_copy(
            update={
                "image_count": len(written),
                "content_hash": content_hash or written.content_hash(manifest.classes),
                "index_sha256": digest,
            }
        )
        write_text_atomic(root / MANIFEST_NAME, manifest.model_dump_json(indent=2))

    @property
    def labeled(self) -> bool:
        return self.manifest.labeled

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def content_hash(self) -> str:
        return self.manifest.content_hash

    def __len__(self) -> int:
        return self.manifest.image_count

    def samples(self, start: int = 0, stop: int | None = None) -> ImageSamples:
        """(absolute image path, class index) pairs of index rows ``start`` to ``stop`` (all by default), read on
        demand; the index is -1 when unlabeled."""
        return ImageSamples(self.root, self.index, start, stop)

    def labelled_rows(self) -> np.ndarray:
        """Index rows of the images that came in a labelled batch (under ``<class>/labelled-<hash>/``)."""
        return np.flatnonzero([_IN_A_LABELLED_BATCH(path) is not None for path in self.index.path])

    def records(self) -> list[ImageRecord]:
        """Every image's record as an object: for a few images (a test, a report), not for a data set's worth."""
        classes, rows = self.manifest.classes, (self.index.row(i) for i in range(len(self)))
        return [ImageRecord(**{**r._asdict(), "label": classes[r.label] if r.label >= 0 else None}) for r in rows]

    def head(self, count: int) -> ImageDirectory:
        """This directory with only its first ``count`` images, in memory (nothing on disk changes)."""
        subset = ImageDirectory(self.root)
        subset._index = self.index.take(np.arange(min(count, len(self))))
        subset.manifest.image_count = len(subset._index)
        return subset

    def median_side(self) -> int:
        """Median of the images' longer sides, in pixels (0 for an empty directory)."""
        if not len(self):
            return 0
        sides = np.sort(np.maximum(self.index.width, self.index.height))
        return int(sides[len(sides) // 2])
