"""A training's output when it is an S3 folder (``work_dir`` on ``s3://``): no filesystem shared between hosts is
needed.

Training writes into the local copy of its output folder (tasks/storage/work_dir_on_s3.py ``local_folder``), and
``OutputMirror`` keeps it and the S3 folder in step on every look of the launcher: the host that holds rank 0's
newer epochs uploads them (the checkpoint, then metrics.json, so whoever sees epoch N in metrics.json finds its
checkpoint); a host behind downloads them. A node retried on another host thus resumes from the uploaded
checkpoint, and after an elastic restart rank 0 resumes from the newest one wherever it now runs.
``stage_training`` puts a training's inputs on this host (tasks/work_dir/images.py) before it starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

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
from tasks.storage.local_files import atomic_write
from tasks.storage.s3 import download_files, is_s3_uri, list_s3_names, read_s3_object, upload_files
from tasks.storage.work_dir_on_s3 import fetch_folder, files_below, join, local_folder
from tasks.work_dir.images import fetch_image_directory

logger = logging.getLogger(__name__)
# metrics.json last: it announces an epoch whose checkpoint and weights are already there.
OUTPUT_FILES = (CHECKPOINT_FILE, WEIGHTS_FILE, SPEC_FILE, CLASSES_FILE, TRAINING_LOG_FILE, METRICS_FILE)


def file_version(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of ``path``; None when there is no such file."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def epochs_in(data: bytes | None) -> int:
    return -1 if data is None else len(TrainingMetrics.model_validate_json(data).epochs)


class OutputMirror:
    """A training output folder on S3 and its local copy on this host, kept in step (see the module's docstring)."""

    def __init__(self, location: str) -> None:
        self.location, self.local = location, local_folder(location)
        # What this mirror last uploaded of each file, as (inode, size, mtime), and the metrics.json that announced
        # it: the best weights stay as they are for epochs at a time, the spec and classes for the whole run, and
        # they are not sent again until they change (the worker writes each file anew and renames it over the old
        # one: a new version has a new stat). Once the stored metrics.json is another's, everything is sent again.
        self._uploaded: dict[str, tuple[int, int, int]] = {}
        self._announced: bytes | None = None

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
            if stored_metrics != self._announced:  # another host stored epochs since (or this mirror never did)
                self._uploaded.clear()
            # Each file's stat before it is read: a version written during the upload is sent at the next look.
            present = {n: file_version(self.local / n) for n in OUTPUT_FILES if n != METRICS_FILE}
            changed = [n for n, version in present.items() if version and self._uploaded.get(n) != version]
            upload_files(self.local, changed, self.location, last=(METRICS_FILE, announced))
            self._uploaded.update({n: present[n] for n in changed})
            self._announced = announced
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
