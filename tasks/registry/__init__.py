"""The model registry: versioned, aliased trained models on a local folder (default) or ``s3://bucket/prefix``.

    layout.py     the contract: names, references, records and their keys
    backends.py   the storage interface and the local-disk backend; s3.py the S3 one
    core.py       register (claim, upload, commit), list, resolve, aliases, champion/challenger, fetch

The Prefect tasks are at the bottom of this module.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tasks.model_directory import ModelDirectory
from tasks.registry.backends import LocalBackend, RegistryBackend, open_backend
from tasks.registry.core import (
    challenge,
    fetch_model,
    list_versions,
    load_model,
    read_aliases,
    read_registration,
    register_model,
    resolve,
    set_alias,
)
from tasks.registry.layout import (
    CLAIM_FILE,
    REGISTRATION_FILE,
    AliasRecord,
    DatasetLineage,
    ModelReference,
    Promotion,
    Registration,
    check_model_name,
    parse_reference,
)

__all__ = [
    "CLAIM_FILE", "REGISTRATION_FILE", "AliasRecord", "DatasetLineage", "LocalBackend", "ModelReference", "Promotion",
    "Registration", "RegistryBackend", "challenge", "check_model_name", "default_model_name", "fetch_model",
    "list_versions", "load_model", "open_backend", "parse_reference", "read_aliases", "read_registration",
    "register_model", "resolve", "set_alias",
]  # fmt: skip


def default_model_name(train_source: str, architecture: str) -> str:
    """``<data set>-<architecture>``, the data set named by the training folder (or its parent for
    ``.../train``), e.g. ``data/digits/train`` + resnet18 -> ``digits-resnet18``."""
    source = Path(train_source)
    stem = source.name.split(".")[0]
    if stem.lower() in {"train", "training", "trainset"} and source.parent.name:
        stem = source.parent.name
    slug = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._") or "images"
    return check_model_name(f"{slug}-{architecture}"[:100])


# --- Prefect tasks ------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
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


def _promotion_markdown(promotion: Promotion) -> str:
    champion = "none (alias not set)" if promotion.champion_version is None else (
        f"version {promotion.champion_version}: {promotion.champion if promotion.champion is not None else 'no value'}"
    )  # fmt: skip
    verdict = "promoted" if promotion.promoted else "not promoted: it does not beat the champion"
    return (
        f"### Promotion to `{promotion.alias}`: {verdict}\n\n| | {promotion.metric} |\n|---|---|\n"
        f"| challenger (this version) | {promotion.challenger:.4f} |\n| champion | {champion} |\n"
    )


@task(name="register", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE)
def register(
    registry: str,
    name: str | None,
    model_dir: str,
    evaluation: Evaluation,
    datasets: dict[str, str],
    params: dict[str, Any],
    promote_to: str | None = None,
    promotion_metric: str = "accuracy",
) -> RegisteredModel:
    """Register with metrics, parameters and the lineage of ``datasets`` (role -> ImageDirectory).

    ``name`` defaults to ``<training data set>-<architecture>``. Artifacts ``registered-model`` and, with
    ``promote_to``, ``promotion`` (champion/challenger on ``promotion_metric``).
    """
    trained = ModelDirectory(model_dir)
    training = trained.metrics()
    name = name or default_model_name(ImageDirectory(datasets["train"]).manifest.source, trained.spec.architecture)
    metrics = {
        **evaluation.figures(),
        "best_top1": training.best_top1,
        "best_epoch": training.best_epoch,
        "epochs_trained": len(training.epochs),
    }
    registration, location = register_model(
        registry, name, trained,
        metrics=metrics, params=params, datasets={role: lineage(d) for role, d in datasets.items()},
        flow_run_id=flow_run.get_id(), promote_to=promote_to, promotion_metric=promotion_metric,
    )  # fmt: skip
    figures = "\n".join(f"| {k} | {v:.4f} |" for k, v in metrics.items() if isinstance(v, float))
    create_markdown_artifact(
        key="registered-model",
        markdown=f"### {name} version {registration.version}\n\nStored in `{location}`\n\n"
        f"| figure | value |\n|---|---|\n{figures}\n",
    )
    if registration.promotion:
        create_markdown_artifact(key="promotion", markdown=_promotion_markdown(registration.promotion))
    return RegisteredModel(registration=registration, location=location)


@task(name="resolve-model", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE)
def resolve_model(model: str, registry: str, cache_dir: str) -> str:
    """The local ModelDirectory for a ModelDirectory path or a registry reference (downloaded from S3 once)."""
    model_dir = load_model(model, registry, cache_dir)
    get_run_logger().info("model %s -> %s (%s)", model, model_dir.root, ", ".join(model_dir.classes))
    return str(model_dir.root)
