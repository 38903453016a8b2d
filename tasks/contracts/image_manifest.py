"""``image_directory.json``, the manifest of an ImageDirectory: what a person reads about it (classes, counts,
source, settings, warnings, where a split side came from) and the per-image record its index holds as columns.

The manifest is written last: a directory with a manifest is complete. It names its index file's sha256 and holds
the images' ``content_hash``, so neither needs the index read. Format 2 moved the per-image records out of the
JSON (format 1 listed them under ``images``: about 2 KB an image in every process that loaded it). FORMAT_VERSION
stays 2 while fields are only added with defaults. Reading and writing a directory: ``tasks.contracts.image_directory``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from tasks.contracts.image_index import INDEX_NAME

MANIFEST_NAME = "image_directory.json"
FORMAT_VERSION = 2


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
