"""Registering a model: its files checked, a version number claimed with an exclusive create, the files
uploaded under it, then ``registration.json`` committed; all or nothing when the registry's storage refuses a
write. Given a flow run id, a registration first returns a version that run already committed with the same
files (a Prefect retry after a failure past the commit)."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.contracts.model_directory import MODEL_FILES, OPTIONAL_FILES, ModelDirectory
from tasks.contracts.registry_layout import (
    CLAIM_FILE,
    REGISTRATION_FILE,
    Claim,
    DatasetLineage,
    Registration,
    check_alias,
    check_model_name,
    version_key,
    version_numbers,
)
from tasks.errors import InvalidModelDirectoryError, OutputStorageError
from tasks.registry.backends import RegistryBackend
from tasks.registry.core import Registry, _create_owned, backend_of, registrations
from tasks.registry.promotion import PromotionPolicy, challenge, check_metric, promote
from tasks.storage.local_files import sha256_file, storage_fault
from tasks.storage.s3 import is_s3_uri


def _hash_model_files(model_dir: ModelDirectory) -> dict[str, str]:
    """sha256 of each file a version carries; refuses (before any version is claimed) a folder missing one."""
    names = [*MODEL_FILES, *(name for name in OPTIONAL_FILES if (model_dir.root / name).is_file())]
    hashes, problems = {}, []
    for file_name in names:
        try:
            hashes[file_name] = sha256_file(model_dir.root / file_name)
        except OSError as error:
            problems.append(f"{file_name} ({error.strerror or error})")
    if problems:
        raise InvalidModelDirectoryError(
            f"{model_dir.root} cannot be registered: {', '.join(problems)}; a version holds {', '.join(names)}"
        )
    return hashes


def _committed_by(
    backend: RegistryBackend,
    name: str,
    flow_run_id: str | None,
    task_run_id: str | None,
    training_run_id: str | None,
    files: dict[str, str],
) -> Registration | None:
    """The version this call already committed: by its flow and task run and files, or, for a run that replaced
    a lost one (``training_run_id`` another run's), by its training: the lost run may have committed one before its
    host went."""
    replacing = training_run_id not in (None, flow_run_id)
    if not (flow_run_id or replacing):
        return None
    return next(
        (
            r
            for r in registrations(backend, name, newest_first=True)
            if (replacing and r.training_run_id == training_run_id)
            or (flow_run_id and (r.flow_run_id, r.task_run_id, r.files) == (flow_run_id, task_run_id, files))
        ),
        None,
    )


def _claim_version(backend: RegistryBackend, name: str, claim: bytes) -> int:
    # Start above every number in use, claimed or not: versions registered before claims existed have none.
    version = max(version_numbers(backend.list_keys(name), name), default=0) + 1
    while not _create_owned(backend, version_key(name, version, CLAIM_FILE), claim):
        version += 1
    return version


@contextlib.contextmanager
def _all_or_nothing(backend: RegistryBackend, what: str, needed: int, stored: list[str]) -> Iterator[None]:
    """Around storing a version: when the registry's storage refuses a write (full, read-only, S3 refusing), the
    ``stored`` keys are removed (a claim stays, so its number is never reused) and the error's first line says
    that nothing was registered."""
    try:
        yield
    except (OSError, OutputStorageError) as error:
        where = None if is_s3_uri(backend.location) else Path(backend.location)
        fault = error if isinstance(error, OutputStorageError) else storage_fault(what, error, needed, where)
        if fault is None:
            raise
        for key in stored:
            with contextlib.suppress(Exception):
                backend.delete(key)
        removed = f" (the {len(stored)} files stored before it were removed)" if stored else ""
        raise OutputStorageError(f"nothing was registered: {fault}{removed}") from None


def register_model(
    registry: Registry,
    name: str,
    model_dir: ModelDirectory,
    *,
    metrics: dict[str, Any],
    params: dict[str, Any],
    datasets: dict[str, DatasetLineage],
    flow_run_id: str | None = None,
    task_run_id: str | None = None,
    training_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    promotion: PromotionPolicy | None = None,
) -> tuple[Registration, str]:
    """Store a trained model as the next version of ``name``; returns its record and location.

    With ``flow_run_id`` (and ``task_run_id``) the call is idempotent: a version that run already committed
    with the same files is returned, not registered again; with ``training_run_id``, so is any version of that
    training (a run that replaced a lost one, and the lost run, register one version between them).

    With ``promotion.promote_to``, the version takes that alias if it beats the alias's current version by the
    policy's rule (``PromotionPolicy.rule``); the returned record carries the final verdict (``registration.json``
    keeps the one made at commit time). With ``promotion.approval`` too, the alias is left where it is and a
    version that beats the champion is marked ``awaiting_approval``: a person's answer moves it
    (``promotion.decide_promotion``).
    """
    backend = backend_of(registry)
    check_model_name(name)
    policy = promotion or PromotionPolicy()
    alias, rule = policy.promote_to, policy.rule()
    if alias:
        check_alias(alias)
        check_metric(metrics, rule.metric)
    files = _hash_model_files(model_dir)
    registration = _committed_by(backend, name, flow_run_id, task_run_id, training_run_id, files)
    if registration is None:
        claim = Claim(
            token=uuid.uuid4().hex, created_at=datetime.now(timezone.utc), host=socket.gethostname(), pid=os.getpid()
        )
        stored: list[str] = []
        size = sum((model_dir.root / f).stat().st_size for f in files)
        with _all_or_nothing(backend, f"{name}'s files to the registry {backend.location}", size, stored):
            version = _claim_version(backend, name, claim.model_dump_json().encode())
            for file_name in files:
                backend.upload(version_key(name, version, file_name), model_dir.root / file_name)
                stored.append(version_key(name, version, file_name))
            verdict = challenge(backend, name, alias, rule, metrics) if alias else None
            if verdict and policy.approval:
                verdict = verdict.model_copy(update={"promoted": False, "awaiting_approval": verdict.promoted})
            registration = Registration(
                name=name,
                version=version,
                created_at=datetime.now(timezone.utc),
                metrics=metrics,
                params=params,
                datasets=datasets,
                flow_run_id=flow_run_id,
                task_run_id=task_run_id,
                training_run_id=training_run_id,
                tags=tags or {},
                files=files,
                promotion=verdict,
            )
            record = registration.model_dump_json(indent=2).encode()
            if not _create_owned(backend, version_key(name, version, REGISTRATION_FILE), record):
                raise RuntimeError(
                    f"{backend.location}/{name}/{version} was committed by another registration despite our claim"
                )
    if alias and not policy.approval:
        registration = registration.model_copy(update={"promotion": promote(backend, registration, alias, rule)})
    return registration, f"{backend.location}/{version_key(name, registration.version)}"
