"""The ImageDirectory contract: what `convert` writes and every later stage reads.

Layout::

    <root>/image_directory.json          the manifest below
    <root>/<class name>/<image file>     labeled directories (one folder per class)
    <root>/<image file>                  unlabeled directories (for scoring)

Class indices are positions in ``classes``. Later stages read images through
``ImageDirectory.samples()``; none of them walks raw sources again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, Field

from tasks.errors import InvalidDatasetError
from tasks.fileio import write_text_atomic

MANIFEST_NAME = "image_directory.json"
FORMAT_VERSION = 1
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"})


class ImageRecord(BaseModel):
    path: str = Field(description="POSIX path relative to the ImageDirectory root")
    label: str | None = Field(description="class name; None in an unlabeled directory")
    sha256: str
    size_bytes: int
    width: int
    height: int
    mode: str = Field(description="Pillow mode of the stored file, e.g. 'L' or 'RGB'")


class QuarantinedFile(BaseModel):
    path: str = Field(description="path relative to the source")
    reason: str


class ImageDirectoryManifest(BaseModel):
    format_version: int = FORMAT_VERSION
    labeled: bool
    classes: list[str] = Field(description="ordered class names; a class's index is its position")
    counts: dict[str, int] = Field(description="images per class")
    images: list[ImageRecord]
    source: str = Field(description="where the images came from")
    quarantined: list[QuarantinedFile] = []

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
    def write(cls, root: Path, manifest: ImageDirectoryManifest) -> "ImageDirectory":
        write_text_atomic(root / MANIFEST_NAME, manifest.model_dump_json(indent=2))
        return cls(root)

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
