"""The ImageDirectory contract: what `convert` writes and every later stage reads.

Layout::

    <root>/image_directory.json          the manifest below
    <root>/<class folder>/<image file>   labeled directories (one folder per class, see ``class_folders``)
    <root>/<image file>                  unlabeled directories (for scoring; sub-folders of the source are kept)

Class indices are positions in ``classes``. A class's folder is its name made safe for Linux, macOS and
Windows (``safe_name``): most names are unchanged, and the manifest keeps the readable name. Later stages
read images through ``ImageDirectory.samples()``; none of them walks raw sources again.

FORMAT_VERSION stays 1 while fields are only added with defaults: older manifests still load, and older
readers ignore the new fields.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from tasks.errors import InvalidDatasetError
from tasks.fileio import write_text_atomic

MANIFEST_NAME = "image_directory.json"
FORMAT_VERSION = 1
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"})

# Characters Windows refuses in names (and "%", which escapes them); names Windows reserves for devices.
_UNSAFE_CHARACTERS = frozenset('<>:"/\\|?*%') | {chr(c) for c in range(32)} | {chr(127)}
_RESERVED_NAMES = frozenset({"con", "prn", "aux", "nul"} | {f"{d}{i}" for d in ("com", "lpt") for i in range(1, 10)})
_MAX_NAME_BYTES = 255
_MAX_SUFFIX_BYTES = 16


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


class QuarantinedFile(BaseModel):
    path: str = Field(description="path relative to the source")
    reason: str


class Normalisation(BaseModel):
    """Re-encode images instead of copying them: EXIF orientation applied, one colour mode, a maximum side."""

    mode: Literal["RGB", "L"] = Field("RGB", description="Pillow mode every stored image is converted to")
    max_side: int | None = Field(None, ge=8, description="longer side in pixels; larger images are downscaled")


class SplitRecord(BaseModel):
    """Where a split ImageDirectory came from (tasks/split.py): enough to tell which images it holds."""

    source: str = Field(description="the ImageDirectory that was split")
    source_content_hash: str = Field(description="the source manifest's content_hash (files, labels, sha256s)")
    fraction: float = Field(description="share of each class's distinct images that went to the first side")
    seed: int
    side: Literal["first", "second"]


class ImageDirectoryManifest(BaseModel):
    format_version: int = FORMAT_VERSION
    labeled: bool
    classes: list[str] = Field(description="ordered class names; a class's index is its position")
    counts: dict[str, int] = Field(description="images per class")
    images: list[ImageRecord]
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

    @property
    def content_hash(self) -> str:
        """A digest of the labelled content: same files and labels give the same hash."""
        digest = hashlib.sha256()
        for record in sorted(self.images, key=lambda r: r.path):
            digest.update(f"{record.path}\0{record.label}\0{record.sha256}\n".encode())
        return digest.hexdigest()


class ImageDirectory:
    """A converted image directory on local disk, opened through its manifest."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        manifest_path = self.root / MANIFEST_NAME
        if not manifest_path.is_file():
            raise InvalidDatasetError(
                f"{self.root} is not an ImageDirectory: {MANIFEST_NAME} is missing. "
                "Run the convert stage (tasks.convert_to_image_directory) on your images first."
            )
        self.manifest = ImageDirectoryManifest.model_validate_json(manifest_path.read_text(encoding="utf-8"))

    @classmethod
    def write(cls, root: Path, manifest: ImageDirectoryManifest) -> None:
        write_text_atomic(root / MANIFEST_NAME, manifest.model_dump_json(indent=2))

    @property
    def labeled(self) -> bool:
        return self.manifest.labeled

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    def __len__(self) -> int:
        return len(self.manifest.images)

    def samples(self) -> list[tuple[Path, int]]:
        """(absolute image path, class index) pairs; the index is -1 when unlabeled."""
        index = {name: i for i, name in enumerate(self.manifest.classes)}
        return [
            (self.root / record.path, index[record.label] if record.label is not None else -1)
            for record in self.manifest.images
        ]

    def median_side(self) -> int:
        """Median of the images' longer sides, in pixels (0 for an empty directory)."""
        sides = sorted(max(r.width, r.height) for r in self.manifest.images)
        return sides[len(sides) // 2] if sides else 0
