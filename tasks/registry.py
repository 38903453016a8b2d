"""The model registry contract and its local-disk implementation.

Layout::

    <registry>/<model name>/<version>/model.pt, model_spec.json, classes.json, metrics.json, training_log.csv
    <registry>/<model name>/<version>/registration.json     written last: its presence commits the version

Versions count 1, 2, 3... per name. A version number is claimed with an exclusive ``mkdir`` (two
registrations never share one); files are copied in, then ``registration.json`` is written atomically.
A version folder without ``registration.json`` is an interrupted registration and is never listed.
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tasks.errors import InvalidModelNameError
from tasks.fileio import sha256_file, write_text_atomic
from tasks.model_directory import MODEL_FILES, ModelDirectory

REGISTRATION_FILE = "registration.json"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")


class DatasetLineage(BaseModel):
    source: str
    content_hash: str = Field(description="ImageDirectoryManifest.content_hash")
    images: int


class Registration(BaseModel):
    name: str
    version: int
    created_at: datetime
    metrics: dict[str, Any]
    params: dict[str, Any]
    datasets: dict[str, DatasetLineage]
    flow_run_id: str | None = None
    tags: dict[str, str] = {}
    files: dict[str, str] = Field(description="file name -> sha256")


def check_model_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidModelNameError(
            f"model name {name!r} is not allowed: use 1-100 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. 'digits-resnet18')"
        )
    return name


def list_versions(registry: str | os.PathLike[str], name: str) -> list[int]:
    """Committed versions of ``name``, oldest first."""
    folder = Path(registry) / check_model_name(name)
    if not folder.is_dir():
        return []
    return sorted(
        int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / REGISTRATION_FILE).is_file()
    )


def read_registration(registry: str | os.PathLike[str], name: str, version: int) -> Registration:
    path = Path(registry) / check_model_name(name) / str(version) / REGISTRATION_FILE
    return Registration.model_validate_json(path.read_text(encoding="utf-8"))


def _claim_version(folder: Path) -> tuple[int, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name) for p in folder.iterdir() if p.name.isdigit()]
    version = max(taken, default=0) + 1
    while True:
        try:
            (folder / str(version)).mkdir()
            return version, folder / str(version)
        except FileExistsError:
            version += 1


def register_model(
    registry: str | os.PathLike[str],
    name: str,
    model_dir: ModelDirectory,
    *,
    metrics: dict[str, Any],
    params: dict[str, Any],
    datasets: dict[str, DatasetLineage],
    flow_run_id: str | None = None,
    tags: dict[str, str] | None = None,
) -> tuple[Registration, Path]:
    """Copy a trained model into the next free version of ``name``; returns its record and folder."""
    version, target = _claim_version(Path(registry) / check_model_name(name))
    files = {}
    for file_name in MODEL_FILES:
        shutil.copyfile(model_dir.root / file_name, target / file_name)
        files[file_name] = sha256_file(target / file_name)
    registration = Registration(
        name=name,
        version=version,
        created_at=datetime.now(timezone.utc),
        metrics=metrics,
        params=params,
        datasets=datasets,
        flow_run_id=flow_run_id,
        tags=tags or {},
        files=files,
    )
    write_text_atomic(target / REGISTRATION_FILE, registration.model_dump_json(indent=2))
    return registration, target


def default_model_name(train_source: str, architecture: str) -> str:
    """``<data set>-<architecture>``, the data set named by the training folder (or its parent for
    ``.../train``), e.g. ``data/digits/train`` + resnet18 -> ``digits-resnet18``."""
    source = Path(train_source)
    stem = source.name.split(".")[0]
    if stem.lower() in {"train", "training", "trainset"} and source.parent.name:
        stem = source.parent.name
    slug = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._") or "images"
    return check_model_name(f"{slug}-{architecture}"[:100])


# --- Prefect task -------------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.runtime import flow_run  # noqa: E402

from tasks.evaluate import Evaluation  # noqa: E402
from tasks.image_directory import ImageDirectory  # noqa: E402
from tasks.retrying import retry_unless_input_error  # noqa: E402


class RegisteredModel(BaseModel):
    registration: Registration
    location: str


def lineage(image_dir: str | os.PathLike[str]) -> DatasetLineage:
    manifest = ImageDirectory(image_dir).manifest
    return DatasetLineage(source=manifest.source, content_hash=manifest.content_hash, images=len(manifest.images))


@task(name="register", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE)
def register(
    registry: str,
    name: str | None,
    model_dir: str,
    evaluation: Evaluation,
    datasets: dict[str, str],
    params: dict[str, Any],
) -> RegisteredModel:
    """Register with metrics, parameters and the lineage of ``datasets`` (role -> ImageDirectory).

    ``name`` defaults to ``<training data set>-<architecture>``. Artifact ``registered-model``.
    """
    trained = ModelDirectory(model_dir)
    training = trained.metrics()
    name = name or default_model_name(ImageDirectory(datasets["train"]).manifest.source, trained.spec.architecture)
    metrics = {
        **evaluation.model_dump(exclude={"per_class", "confusion_matrix", "classes"}),
        "best_top1": training.best_top1,
        "best_epoch": training.best_epoch,
        "epochs_trained": len(training.epochs),
    }
    registration, location = register_model(
        registry, name, trained,
        metrics=metrics, params=params, datasets={role: lineage(d) for role, d in datasets.items()},
        flow_run_id=flow_run.get_id(),
    )  # fmt: skip
    figures = "\n".join(f"| {k} | {v:.4f} |" for k, v in metrics.items() if isinstance(v, float))
    create_markdown_artifact(
        key="registered-model",
        markdown=f"### {name} version {registration.version}\n\nStored in `{location}`\n\n"
        f"| figure | value |\n|---|---|\n{figures}\n",
    )
    return RegisteredModel(registration=registration, location=str(location))
