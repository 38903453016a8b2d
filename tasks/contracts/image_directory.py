"""The ImageDirectory contract: what `convert` writes and every later stage reads.

Layout::

    <root>/image_directory.json          the manifest below: classes, counts, source, settings, warnings (JSON)
    <root>/image_index.npz               one record per image, as memory-mapped columns (``tasks.contracts.image_index``)
    <root>/<class folder>/<image file>   labeled directories (one folder per class, see ``class_folders``)
    <root>/<image file>                  unlabeled directories (for scoring; sub-folders of the source are kept)

Class indices are positions in ``classes``. A class's folder is its name made safe for Linux, macOS and
Windows (``safe_name``): most names are unchanged, and the manifest keeps the readable name. Later stages
read images through ``ImageDirectory.samples()``; none of them walks raw sources again.

The manifest is written last: a directory with a manifest is complete. It names each index file's sha256 and
holds the images' ``content_hash``, so neither needs the index read. Format 2 moved the per-image records out of
the JSON (format 1 listed them under ``images``: about 2 KB an image in every process that loaded it); a format 1
directory still opens, its records read into an index in memory. FORMAT_VERSION stays 2 while fields are only
added with defaults.
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from tasks.contracts.image_index import INDEX_NAME, ImageIndex, Row
from tasks.contracts.index_writer import IndexWriter
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import write_text_atomic

MANIFEST_NAME = "image_directory.json"
FORMAT_VERSION = 2
# Formats stored re-encoded as JPEG (quality 95, RGB): phones' formats that not every decode path reads (nvJPEG,
# torchvision, onnx checks). HEIC/HEIF through pillow-heif, AVIF through Pillow itself.
REENCODED_AS_JPEG = frozenset({"HEIF", "AVIF"})
REENCODED_EXTENSIONS = frozenset({".heic", ".heif", ".avif"})
IMAGE_EXTENSIONS = (
    frozenset({".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}) | REENCODED_EXTENSIONS
)

# Characters Windows refuses in names (and "%", which escapes them); names Windows reserves for devices.
_UNSAFE_CHARACTERS = frozenset('<>:"/\\|?*%') | {chr(c) for c in range(32)} | {chr(127)}
_RESERVED_NAMES = frozenset({"con", "prn", "aux", "nul"} | {f"{d}{i}" for d in ("com", "lpt") for i in range(1, 10)})
_MAX_NAME_BYTES = 255
_MAX_SUFFIX_BYTES = 16


EXIF_ORIENTATION = 0x0112  # the EXIF tag (1-8) every viewer turns a photo by; 1: shown as stored


def orientation_of(image) -> int:
    """The EXIF orientation (1-8) of an opened PIL image, from its header: 1 when it has none or not one of the
    eight. A PNG's eXIf chunk counts only when it comes before the image data (where Pillow reads it on opening):
    asking for one after would decode the whole image."""
    if image.format == "PNG" and "exif" not in image.info:
        return 1
    value = image.getexif().get(EXIF_ORIENTATION, 1)
    return value if value in range(1, 9) else 1


def stored_file_name(name: str) -> str:
    """The name an image is stored under: ``safe_name``, and ``.jpg`` after a format stored as JPEG
    (``IMG_0001.HEIC`` -> ``IMG_0001.HEIC.jpg``: no other file's name can be the same)."""
    safe = safe_name(name)
    return safe + ".jpg" if os.path.splitext(name)[1].lower() in REENCODED_EXTENSIONS else safe


def safe_name(name: str) -> str:
    """``name`` as one path component that is legal and visible on Linux, macOS and Windows.

    Unsafe characters become ``%XX`` (UTF-8 bytes) and ``%`` itself is escaped, so distinct names stay
    distinct; spaces and unicode letters are kept (NFC, the form Linux and Windows store). A leading dot
    (hidden), a trailing dot or space (dropped by Windows) and reserved device names are escaped too.
    """
    if not name:
        raise ValueError("an empty name has no safe form")
    name = unicodedata.normalize("NFC", name)
    chars = ["".join(f"%{b:02X}" for b in c.encode()) if c in _UNSAFE_CHARACTERS else c for c in name]
    if chars[0] == ".":
        chars[0] = "%2E"
    if chars[-1] in (".", " "):
        chars[-1] = f"%{ord(chars[-1]):02X}"
    if name.split(".")[0].lower() in _RESERVED_NAMES:
        chars[0] = f"%{ord(name[0]):02X}"
    safe = "".join(chars)
    if len(safe.encode()) > _MAX_NAME_BYTES:
        # Cut the stem, never the extension (readers pick images by it); the digest keeps cut names distinct.
        stem, suffix = os.path.splitext(safe)
        if len(suffix.encode()) > _MAX_SUFFIX_BYTES:
            stem, suffix = safe, ""
        tail = f"~{hashlib.sha256(name.encode()).hexdigest()[:16]}{suffix}"
        safe = stem.encode()[: _MAX_NAME_BYTES - len(tail.encode())].decode(errors="ignore") + tail
    return safe


def class_folders(classes: list[str]) -> dict[str, str]:
    """A folder per class: ``safe_name``, made unique where only letter case differs (macOS, Windows)."""
    folders: dict[str, str] = {}
    taken: set[str] = set()
    for name in classes:
        folder, n = safe_name(name), 1
        while folder.casefold() in taken:
            n += 1
            folder = f"{safe_name(name)}~{n}"
        taken.add(folder.casefold())
        folders[name] = folder
    return folders


class ImageRecord(BaseModel):
    path: str = Field(description="POSIX path relative to the ImageDirectory root")
    label: str | None = Field(description="class name; None in an unlabeled directory")
    sha256: str
    size_bytes: int
    width: int
    height: int
    mode: str = Field(description="Pillow mode of the stored file, e.g. 'L' or 'RGB'")
    source_path: str | None = Field(
        None, description="the user's name for the file: its path relative to the source, as it was spelt there"
    )
    orientation: int = Field(
        1,
        ge=0,
        le=8,
        description="the source's EXIF orientation, applied when the image was stored upright (1: stored as it "
        "was; 0: not recorded, an older conversion)",
    )
    perceptual_hash: int = Field(
        0,
        ge=0,
        lt=1 << 64,
        description="64-bit DCT perceptual hash of the stored image (tasks.near_duplicates); 0: not hashed (under "
        "32 pixels on a side, or an older conversion)",
    )


class QuarantinedFile(BaseModel):
    path: str = Field(description="path relative to the source")
    reason: str


class Normalisation(BaseModel):
    """Re-encode images instead of copying them: EXIF orientation applied, one colour mode, a maximum side."""

    mode: Literal["RGB", "L"] = Field("RGB", description="Pillow mode every stored image is converted to")
    max_side: int | None = Field(None, ge=8, description="longer side in pixels; larger images are downscaled")


class SplitRecord(BaseModel):
    """Where a split ImageDirectory came from (tasks/data/split.py): enough to tell which images it holds."""

    source: str = Field(description="the ImageDirectory that was split")
    source_content_hash: str = Field(description="the source manifest's content_hash (files, labels, sha256s)")
    fraction: float = Field(description="share of each class's distinct images that went to the first side")
    seed: int
    side: Literal["first", "second"]
    near_duplicate_distance: int | None = Field(
        None,
        description="perceptual-hash bits within which images were kept on one side (-1: identical files only; "
        "None: split before near-duplicates were looked for)",
    )


class ImageDirectoryManifest(BaseModel):
    """``image_directory.json``: what a person reads about an ImageDirectory; the images' records are its index."""

    format_version: int = FORMAT_VERSION
    labeled: bool
    classes: list[str] = Field(description="ordered class names; a class's index is its position")
    counts: dict[str, int] = Field(description="images per class")
    image_count: int = Field(0, description="images in the directory (rows of its index)")
    content_hash: str = Field(
        "", description="sha256 over every image's path, label and sha256 in path order: same content, same hash"
    )
    index_sha256: str = Field("", description=f"sha256 of {INDEX_NAME}, the images' records")
    source: str = Field(description="where the images came from: a folder, an archive or an s3:// URI")
    quarantined: list[QuarantinedFile] = []
    class_folders: dict[str, str] = Field({}, description="folder (below the root) holding each class's images")
    labels_source: str | None = Field(None, description="labels file the labels came from; None: class folders")
    normalisation: Normalisation | None = Field(None, description="None: images are byte-for-byte copies")
    conversion_hash: str | None = Field(
        None, description="sha256 of the source's content and the conversion settings; equal hash, equal output"
    )
    warnings: list[str] = Field([], description="problems worth a look that did not stop the conversion")
    split: SplitRecord | None = Field(None, description="set when this directory is one side of a split")


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
                "Run the convert stage (tasks.convert_to_image_directory) on your images first."
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
                "convert the images again with this version (tasks.convert_to_image_directory)"
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
