"""A run's files when ``work_dir`` is ``s3://bucket/prefix``: no filesystem shared between hosts is needed.

The flow converts the images on its own host and stores each ImageDirectory (and the model spec) under the run's
S3 folder once (``publish``). Every host that trains keeps:

    <cache>/images/<manifest sha256>/   an ImageDirectory fetched from S3, checked file by file against the
                                        manifest's sha256; a second fetch of the same content is a cache hit
    <cache>/s3/<bucket>/<key>/          a local copy of any other S3 folder (model spec, training output)

``<cache>`` is ``$IMAGE_CLASSIFIER_CACHE`` (default ``~/.cache/image-classifier``), one per host.

Training writes into the local copy of its output folder, and ``OutputMirror`` keeps it and the S3 folder in
step on every look of the launcher: the host that holds rank 0's newer epochs uploads them (the checkpoint,
then metrics.json, so whoever sees epoch N in metrics.json finds its checkpoint); a host behind downloads them.
A node retried on another host thus resumes from the uploaded checkpoint, and after an elastic restart rank 0
resumes from the newest one wherever it now runs. Plain paths pass through every function unchanged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory
from tasks.contracts.image_index import INDEX_NAME
from tasks.contracts.model_directory import (
    CHECKPOINT_FILE,
    CLASSES_FILE,
    LOGS_DIR,
    METRICS_FILE,
    SPEC_FILE,
    TRAINING_LOG_FILE,
    WEIGHTS_FILE,
    TrainingMetrics,
)
from tasks.contracts.training_config import TrainingFolders
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import atomic_write, sha256_file
from tasks.storage.s3 import (
    download_files,
    is_s3_uri,
    list_s3_names,
    parse_s3_uri,
    read_s3_object,
    upload_files,
)

CACHE_VARIABLE = "IMAGE_CLASSIFIER_CACHE"
logger = logging.getLogger(__name__)
# metrics.json last: it announces an epoch whose checkpoint and weights are already there.
OUTPUT_FILES = (CHECKPOINT_FILE, WEIGHTS_FILE, SPEC_FILE, CLASSES_FILE, TRAINING_LOG_FILE, METRICS_FILE)


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "image-classifier")


def join(location: str, *parts: str) -> str:
    """``location/part/...`` for a path or an S3 URI."""
    return "/".join([location.rstrip("/"), *parts]) if is_s3_uri(location) else str(Path(location, *parts))


def local_folder(location: str) -> Path:
    """Where this host keeps ``location``: the path itself, or its copy under the cache for an S3 URI."""
    if not is_s3_uri(location):
        return Path(location)
    where = parse_s3_uri(location)
    return cache_root() / "s3" / where.bucket / where.prefix


def files_below(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file())


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


def fetch_folder(location: str) -> Path:
    """A local copy of a small folder (a model spec): itself, or every object below the S3 URI downloaded."""
    if not is_s3_uri(location):
        return Path(location)
    local = local_folder(location)
    download_files(location, list_s3_names(location), local)
    return local


def epochs_in(data: bytes | None) -> int:
    return -1 if data is None else len(TrainingMetrics.model_validate_json(data).epochs)


class OutputMirror:
    """A training output folder on S3 and its local copy on this host, kept in step (see the module's docstring)."""

    def __init__(self, location: str) -> None:
        self.location, self.local = location, local_folder(location)

    def local_epochs(self) -> int:
        path = self.local / METRICS_FILE
        return epochs_in(path.read_bytes()) if path.is_file() else -1

    def remote_metrics(self) -> TrainingMetrics | None:
        data = read_s3_object(join(self.location, METRICS_FILE))
        return None if data is None else TrainingMetrics.model_validate_json(data)

    def sync(self) -> None:
        """Upload the local epochs when they are ahead of the stored ones; download the stored ones when behind.

        Either way metrics.json is read first and written last: the training writes each file before the
        metrics.json that announces its epoch, so every file copied after that read is at least as new as the
        epochs it announces, even when the training runs epochs faster than the copy (a checkpoint read while
        three more epochs finished must not be announced by their metrics.json)."""
        path = self.local / METRICS_FILE
        announced = path.read_bytes() if path.is_file() else None
        stored_metrics = read_s3_object(join(self.location, METRICS_FILE))
        local, remote = epochs_in(announced), epochs_in(stored_metrics)
        if local > remote:
            present = [n for n in OUTPUT_FILES if n != METRICS_FILE and (self.local / n).is_file()]
            upload_files(self.local, present, self.location, last=(METRICS_FILE, announced))
        elif remote > local:
            stored = set(list_s3_names(self.location))
            download_files(self.location, [n for n in OUTPUT_FILES if n != METRICS_FILE and n in stored], self.local)
            with atomic_write(self.local / METRICS_FILE, "wb") as handle:
                handle.write(stored_metrics)

    def finish(self) -> None:
        """After training: the last epochs (when this host has them) and this host's ranks' logs."""
        self.sync()
        logs = [n for n in files_below(self.local) if n.startswith(f"{LOGS_DIR}/driver_log_")]
        upload_files(self.local, logs, self.location)

    def download_all(self) -> Path:
        """Every stored file of the finished training (model files, every rank's log) to the local copy."""
        names = sorted(set(list_s3_names(self.location)) - {METRICS_FILE})
        download_files(self.location, [*names, METRICS_FILE], self.local)
        return self.local

    def upload(self, *names: str) -> None:
        upload_files(self.local, names, self.location)


def mirror_of(output: str) -> OutputMirror | None:
    return OutputMirror(output) if is_s3_uri(output) else None


@dataclass(frozen=True)
class StagedTraining:
    """A training's folders (TrainingFolders) on this host, and its output's S3 folder when it has one."""

    train_dir: Path
    validation_dir: Path
    model_spec_dir: Path
    output_dir: Path
    mirror: OutputMirror | None = None

    def sync(self) -> None:
        """One step of keeping the output in step with S3, while training runs: a storage error is logged and
        the next look tries again, rather than stopping the training (``finish`` raises it)."""
        if self.mirror:
            try:
                self.mirror.sync()
            except (BotoCoreError, ClientError, OSError) as error:
                logger.warning(
                    "keeping %s in step with %s failed, tried again shortly: %s",
                    self.output_dir,
                    self.mirror.location,
                    error,
                )

    def finish(self) -> None:
        if self.mirror:
            self.mirror.finish()


def stage_training(folders: TrainingFolders) -> StagedTraining:
    """Fetch a training's inputs to this host; with an S3 output, first download its stored epochs, so that the
    worker resumes from the uploaded checkpoint (a retry on another host)."""
    mirror = mirror_of(folders.output_dir)
    if mirror:
        mirror.sync()
    return StagedTraining(
        fetch_image_directory(folders.train_dir),
        fetch_image_directory(folders.validation_dir),
        fetch_folder(folders.model_spec_dir),
        local_folder(folders.output_dir),
        mirror,
    )
