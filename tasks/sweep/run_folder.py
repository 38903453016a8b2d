"""A sweep's run folder (a path, or ``s3://bucket/prefix`` with this host's copy in its cache): where its study
is kept (``sweep/``), each trial's model (``trials/trial-NNN/model``, study.py ``trial_folder``), and the best
trial's model made ready to register, with the sweep's pictures beside its files. No Prefect, no torch."""

from __future__ import annotations

import shutil
from pathlib import Path

from tasks.storage.s3 import is_s3_uri, read_s3_object
from tasks.storage.work_dir_on_s3 import fetch_folder, join, local_folder
from tasks.sweep.study import STUDY_FILE, trial_folder
from tasks.work_dir.training_output import mirror_of

STUDY_FOLDER = "sweep"


def stored_study(run_dir: str) -> str:
    """Where the study is kept: beside the run's other files (on S3 too)."""
    return join(run_dir, STUDY_FOLDER)


def study_stored(run_dir: str) -> bool:
    """Whether ``run_dir`` (a folder or an S3 URI) holds a sweep's study."""
    if is_s3_uri(run_dir):
        return read_s3_object(join(stored_study(run_dir), STUDY_FILE)) is not None
    return (Path(run_dir) / STUDY_FOLDER / STUDY_FILE).is_file()


def local_study(run_dir: str) -> Path:
    """The study's folder on this host; on S3, the study as last stored when this host has no copy (a sweep
    resumed on another host)."""
    folder = local_folder(run_dir) / STUDY_FOLDER
    if is_s3_uri(run_dir) and not (folder / STUDY_FILE).is_file():
        fetch_folder(stored_study(run_dir))
    return folder


def trial_model(run_dir: str, number: int) -> str:
    """Where trial ``number`` trains its model."""
    return join(run_dir, trial_folder(number), "model")


def best_model_with_pictures(run_dir: str, number: int, pictures: list[Path]) -> str:
    """The best trial's model on this host (downloaded whole when it is on S3), with the sweep's ``pictures``
    copied in beside its files as ``sweep_<name>``: registered with the model, its card shows them."""
    output_dir = trial_model(run_dir, number)
    mirror = mirror_of(output_dir)
    model_dir = mirror.download_all() if mirror else Path(output_dir)
    for picture in pictures:
        shutil.copyfile(picture, model_dir / f"sweep_{picture.name}")
    return str(model_dir)
