"""The ImageDirectories of a run whose ``work_dir`` is ``s3://bucket/prefix``: the flow converts the images on its
own host and stores each ImageDirectory (and the model spec) under the run's S3 folder once (``publish``); every
host that reads one keeps

    <cache>/images/<manifest sha256>/   an ImageDirectory fetched from S3, checked file by file against the
                                        manifest's sha256; a second fetch of the same content is a cache hit

(``<cache>``: tasks/storage/work_dir_on_s3.py). Plain paths pass through every function unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory
from tasks.contracts.image_index import INDEX_NAME
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import sha256_file
from tasks.storage.s3 import download_files, is_s3_uri, read_s3_object, upload_files
from tasks.storage.work_dir_on_s3 import cache_root, files_below, join


def publish(local: str | os.PathLike[str], location: str) -> str:
    """Store a folder this host wrote at ``location``; returns where the next stages read it. A local
    ``location`` is the folder itself. An ImageDirectory is uploaded once: skipped when the stored manifest is
    the same; its manifest goes last, so a reader that finds it finds every image."""
    if not is_s3_uri(location):
        return str(local)
    local = Path(local)
    manifest = local / MANIFEST_NAME
    names = files_below(local)
    if manifest.is_file():
        if read_s3_object(join(location, MANIFEST_NAME)) == manifest.read_bytes():
            return location
        names = [n for n in names if n != MANIFEST_NAME] + [MANIFEST_NAME]
    upload_files(local, names, location)
    return location


def stored_manifest(location: str) -> tuple[bytes, Path]:
    """The manifest of the ImageDirectory stored at ``location`` (S3), and where this host's cache keeps its copy
    (keyed by the manifest's content)."""
    data = read_s3_object(join(location, MANIFEST_NAME))
    if data is None:
        raise InvalidDatasetError(f"{location} holds no {MANIFEST_NAME}: it is not an ImageDirectory")
    return data, cache_root() / "images" / hashlib.sha256(data).hexdigest()[:32]


def fetch_index(location: str, manifest: bytes, folder: Path) -> ImageDirectory:
    """The stored ImageDirectory's index (checked against its manifest's sha256) and manifest, into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    index_sha256 = json.loads(manifest).get("index_sha256")  # none in format 1: the records are in the manifest
    if index_sha256:
        download_files(location, [INDEX_NAME], folder)
        if sha256_file(folder / INDEX_NAME) != index_sha256:
            raise InvalidDatasetError(f"{location}: its {INDEX_NAME} differs from the sha256 its manifest gives")
    (folder / MANIFEST_NAME).write_bytes(manifest)
    return ImageDirectory(folder)


def fetch_image_directory(location: str) -> Path:
    """A local ImageDirectory of ``location``: itself, or a copy in this host's cache keyed by its manifest's
    content, each image checked against the manifest's sha256."""
    if not is_s3_uri(location):
        return Path(location)
    data, target = stored_manifest(location)
    if (target / MANIFEST_NAME).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    download = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.download-"))
    try:
        index = fetch_index(location, data, download).index
        download_files(location, index.path, download)
        wrong = [p for p, sha in zip(index.path, index.sha256) if sha256_file(download / p) != sha.tobytes().hex()]
        if wrong:
            raise InvalidDatasetError(
                f"{location}: {len(wrong)} images differ from their manifest's sha256, e.g. {wrong[0]}"
            )
        try:
            os.rename(download, target)
        except OSError:
            if not (target / MANIFEST_NAME).is_file():  # another fetch of the same content won the race
                raise
    finally:
        shutil.rmtree(download, ignore_errors=True)
    return target
