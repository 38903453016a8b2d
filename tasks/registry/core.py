"""Registry operations over any backend: register (claim, upload, commit), list, resolve, aliases, fetch.

A registration claims ``<name>/<n>/claim.json`` with an exclusive create (next number on a conflict),
uploads the model files under it, then creates ``registration.json``: readers only ever see committed
versions, whose files were all stored before the record naming them.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.errors import InvalidModelNameError, ModelNotFoundError, PipelineInputError
from tasks.fileio import sha256_file
from tasks.image_directory import ImageDirectory
from tasks.model_directory import MODEL_FILES, ONNX_FILE, ModelDirectory
from tasks.registry.backends import LocalBackend, RegistryBackend, open_backend
from tasks.registry.layout import (
    ALIASES_FOLDER,
    CLAIM_FILE,
    REGISTRATION_FILE,
    AliasRecord,
    Claim,
    DatasetLineage,
    ModelReference,
    Promotion,
    Registration,
    alias_key,
    check_alias,
    check_model_name,
    numbered,
    parse_reference,
    version_key,
)

Registry = str | os.PathLike[str] | RegistryBackend


def _backend(registry: Registry) -> RegistryBackend:
    return registry if isinstance(registry, RegistryBackend) else open_backend(registry)


def _create_owned(backend: RegistryBackend, key: str, data: bytes) -> bool:
    """Exclusive create that survives a lost answer: when a retried write finds the key taken, the key
    may hold our own first attempt, which counts as ours."""
    return backend.create_exclusive(key, data) or backend.read(key) == data


def lineage(image_dir: str | os.PathLike[str]) -> DatasetLineage:
    """What a registration records of a data set: its source, content hash and size."""
    manifest = ImageDirectory(image_dir).manifest
    return DatasetLineage(source=manifest.source, content_hash=manifest.content_hash, images=len(manifest.images))


def list_versions(registry: Registry, name: str) -> list[int]:
    """Committed versions of ``name``, oldest first."""
    return sorted(numbered(_backend(registry).list_keys(check_model_name(name)), name, REGISTRATION_FILE))


def read_registration(registry: Registry, name: str, version: int) -> Registration:
    backend = _backend(registry)
    data = backend.read(version_key(name, version, REGISTRATION_FILE))
    if data is None:
        committed = list_versions(backend, name)
        raise ModelNotFoundError(f"{name} has no version {version} in {backend.location}; "
                                 f"committed versions: {committed or 'none'}")  # fmt: skip
    return Registration.model_validate_json(data)


def read_aliases(registry: Registry, name: str) -> dict[str, AliasRecord]:
    backend = _backend(registry)
    records = (backend.read(key) for key in backend.list_keys(f"{check_model_name(name)}/{ALIASES_FOLDER}"))
    aliases = [AliasRecord.model_validate_json(r) for r in records if r is not None]
    return {a.alias: a for a in aliases}


def resolve(registry: Registry, reference: str | ModelReference) -> Registration:
    """The registration a reference names: ``name`` (latest), ``name/3`` or ``name@production``."""
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    backend = _backend(registry)
    if ref.alias:
        data = backend.read(alias_key(ref.name, ref.alias))
        if data is None:
            known = sorted(read_aliases(backend, ref.name))
            raise ModelNotFoundError(f"{ref.name} has no alias {ref.alias!r} in {backend.location}; "
                                     f"aliases: {known or 'none'}")  # fmt: skip
        return read_registration(backend, ref.name, AliasRecord.model_validate_json(data).version)
    if ref.version is not None:
        return read_registration(backend, ref.name, ref.version)
    versions = list_versions(backend, ref.name)
    if not versions:
        raise ModelNotFoundError(f"no model named {ref.name!r} in {backend.location}")
    return read_registration(backend, ref.name, versions[-1])


def set_alias(registry: Registry, name: str, alias: str, version: int) -> AliasRecord:
    """Point ``alias`` at a committed version (creating or moving it)."""
    backend = _backend(registry)
    check_alias(alias)
    read_registration(backend, name, version)
    current = backend.read(alias_key(name, alias))
    record = AliasRecord(
        alias=alias, version=version, updated_at=datetime.now(timezone.utc),
        previous_version=AliasRecord.model_validate_json(current).version if current else None,
    )  # fmt: skip
    backend.write(alias_key(name, alias), record.model_dump_json(indent=2).encode())
    return record


def check_metric(metrics: dict[str, Any], metric: str) -> float:
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        numeric = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise PipelineInputError(f"promotion metric {metric!r} is not among this model's figures: {numeric}")
    return float(value)


def challenge(registry: Registry, name: str, alias: str, metric: str, metrics: dict[str, Any]) -> Promotion:
    """Champion/challenger: should a version with ``metrics`` take ``alias``? Only by beating (strictly,
    higher is better) the alias's current version on ``metric``. An alias not yet set is taken; a champion
    without that figure keeps it (nothing shows the challenger is better)."""
    value = check_metric(metrics, metric)
    backend = _backend(registry)
    current = backend.read(alias_key(name, alias))
    if current is None:
        return Promotion(alias=alias, metric=metric, challenger=value, champion_version=None, champion=None, promoted=True)
    champion = read_registration(backend, name, AliasRecord.model_validate_json(current).version)
    best = champion.metrics.get(metric)
    return Promotion(
        alias=alias, metric=metric, challenger=value, champion_version=champion.version, champion=best,
        promoted=best is not None and value > best,
    )  # fmt: skip


def _claim_version(backend: RegistryBackend, name: str, claim: bytes) -> int:
    # Start above every number in use, claimed or not: versions registered before claims existed have none.
    version = max(numbered(backend.list_keys(name), name), default=0) + 1
    while not _create_owned(backend, version_key(name, version, CLAIM_FILE), claim):
        version += 1
    return version


def register_model(
    registry: Registry,
    name: str,
    model_dir: ModelDirectory,
    *,
    metrics: dict[str, Any],
    params: dict[str, Any],
    datasets: dict[str, DatasetLineage],
    flow_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    promote_to: str | None = None,
    promotion_metric: str = "accuracy",
) -> tuple[Registration, str]:
    """Store a trained model as the next version of ``name``; returns its record and location.

    With ``promote_to``, the version takes that alias if it beats the alias's current version on
    ``promotion_metric``; the decision is recorded in ``registration.json``.
    """
    backend = _backend(registry)
    check_model_name(name)
    if promote_to:
        check_alias(promote_to)
        check_metric(metrics, promotion_metric)
    claim = Claim(token=uuid.uuid4().hex, created_at=datetime.now(timezone.utc), host=socket.gethostname(), pid=os.getpid())
    version = _claim_version(backend, name, claim.model_dump_json().encode())
    file_names = [*MODEL_FILES, *([ONNX_FILE] if (model_dir.root / ONNX_FILE).is_file() else [])]
    files = {}
    for file_name in file_names:
        files[file_name] = sha256_file(model_dir.root / file_name)
        backend.upload(version_key(name, version, file_name), model_dir.root / file_name)
    registration = Registration(
        name=name, version=version, created_at=datetime.now(timezone.utc), metrics=metrics, params=params,
        datasets=datasets, flow_run_id=flow_run_id, tags=tags or {}, files=files,
        promotion=challenge(backend, name, promote_to, promotion_metric, metrics) if promote_to else None,
    )  # fmt: skip
    record = registration.model_dump_json(indent=2).encode()
    if not _create_owned(backend, version_key(name, version, REGISTRATION_FILE), record):
        raise RuntimeError(f"{backend.location}/{name}/{version} was committed by another registration despite our claim")
    if registration.promotion and registration.promotion.promoted:
        set_alias(backend, name, promote_to, version)
    return registration, f"{backend.location}/{version_key(name, version)}"


def fetch_model(registry: Registry, reference: str, cache_dir: str | os.PathLike[str]) -> ModelDirectory:
    """A local ModelDirectory for a reference: the version folder itself on a local registry, otherwise
    a verified download into ``cache_dir/<name>/<version>`` (reused once complete)."""
    backend = _backend(registry)
    registration = resolve(backend, reference)
    folder = version_key(registration.name, registration.version)
    if isinstance(backend, LocalBackend):
        return ModelDirectory(backend.root / folder)
    target = Path(cache_dir) / folder
    if not (target / REGISTRATION_FILE).is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        download = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.download-"))
        try:
            for file_name, digest in registration.files.items():
                backend.download(f"{folder}/{file_name}", download / file_name)
                if sha256_file(download / file_name) != digest:
                    raise OSError(f"{backend.location}/{folder}/{file_name} does not match its sha256 in {REGISTRATION_FILE}")
            (download / REGISTRATION_FILE).write_text(registration.model_dump_json(indent=2), encoding="utf-8")
            # Versions never change, so when several fetches race, the first complete copy stays and the
            # others are dropped: rename() refuses to replace a folder that is not empty.
            os.rename(download, target)
        except OSError:
            if not (target / REGISTRATION_FILE).is_file():
                raise
        finally:
            shutil.rmtree(download, ignore_errors=True)
    return ModelDirectory(target)


def load_model(model: str, registry: Registry, cache_dir: str | os.PathLike[str]) -> ModelDirectory:
    """Everywhere a model is taken: an existing ModelDirectory path, or a reference into ``registry``."""
    if Path(model).is_dir():
        return ModelDirectory(model)
    try:
        reference = parse_reference(model)
    except InvalidModelNameError as error:
        raise InvalidModelNameError(f"{model!r} is neither a model directory nor a registry reference: {error}") from error
    return fetch_model(registry, str(reference), cache_dir)
