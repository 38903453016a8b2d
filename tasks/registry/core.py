"""Registry operations over any backend: register (claim, upload, commit), list, resolve, aliases, fetch.

A registration checks the model files, claims ``<name>/<n>/claim.json`` with an exclusive create (next
number on a conflict), uploads the files under it, then creates ``registration.json``: readers only ever
see committed versions, whose files were all stored before the record naming them. A registration given
a flow run id first looks for a version that run already committed with the same files (a Prefect retry
after a failure past the commit) and returns it instead of claiming another.

An alias moves by compare-and-swap: read it (with its tag), judge, write only if it is unchanged, else
read and judge again; so of two promotions racing, the later write has seen the earlier one.

Every record read back is checked (``layout.parse_registration`` / ``parse_alias``) before its contents
become paths; a corrupt version is left out of listings and of ``latest`` with a warning.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.errors import InvalidModelDirectoryError, InvalidModelNameError, ModelNotFoundError, PipelineInputError
from tasks.fileio import sha256_file
from tasks.image_directory import ImageDirectory
from tasks.model_directory import MODEL_FILES, ONNX_FILE, ModelDirectory
from tasks.registry.backends import LocalBackend, RegistryBackend, open_backend
from tasks.registry.integrity import memo_path, mismatched_files, remember
from tasks.registry.layout import (
    ALIASES_FOLDER,
    CLAIM_FILE,
    REGISTRATION_FILE,
    AliasRecord,
    Claim,
    CorruptRegistryRecordError,
    DatasetLineage,
    ModelIntegrityError,
    ModelReference,
    Promotion,
    Registration,
    alias_key,
    check_alias,
    check_model_name,
    numbered,
    parse_alias,
    parse_reference,
    parse_registration,
    version_key,
)

Registry = str | os.PathLike[str] | RegistryBackend
ALIAS_SWAP_ATTEMPTS = 20
logger = logging.getLogger(__name__)


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


def _record(backend: RegistryBackend, name: str, version: int) -> Registration | None:
    """The checked record of a version; None while it is not committed."""
    key = version_key(name, version, REGISTRATION_FILE)
    data = backend.read(key)
    return None if data is None else parse_registration(data, f"{backend.location}/{key}", name, version)


def _registrations(backend: RegistryBackend, name: str, newest_first: bool = False) -> Iterator[Registration]:
    """Committed versions of ``name``; corrupt ones are left out with a warning."""
    versions = numbered(backend.list_keys(check_model_name(name)), name, REGISTRATION_FILE)
    for version in sorted(versions, reverse=newest_first):
        try:
            record = _record(backend, name, version)
        except CorruptRegistryRecordError as error:
            logger.warning("%s: this version is left out", error)
            continue
        if record is not None:
            yield record


def list_versions(registry: Registry, name: str) -> list[int]:
    """Committed, readable versions of ``name``, oldest first."""
    return [r.version for r in _registrations(_backend(registry), name)]


def read_registration(registry: Registry, name: str, version: int) -> Registration:
    backend = _backend(registry)
    record = _record(backend, check_model_name(name), version)
    if record is None:
        committed = list_versions(backend, name)
        raise ModelNotFoundError(f"{name} has no version {version} in {backend.location}; "
                                 f"committed versions: {committed or 'none'}")  # fmt: skip
    return record


def _alias(backend: RegistryBackend, name: str, alias: str) -> AliasRecord | None:
    key = alias_key(name, alias)
    data = backend.read(key)
    return None if data is None else parse_alias(data, f"{backend.location}/{key}", name, alias)


def read_aliases(registry: Registry, name: str) -> dict[str, AliasRecord]:
    """The aliases of ``name``; unreadable alias files are left out with a warning."""
    backend = _backend(registry)
    aliases = {}
    for key in backend.list_keys(f"{check_model_name(name)}/{ALIASES_FOLDER}"):
        alias = key.rsplit("/", 1)[-1].removesuffix(".json")
        try:
            record = _alias(backend, name, check_alias(alias))
        except (CorruptRegistryRecordError, InvalidModelNameError) as error:
            logger.warning("%s/%s: alias left out: %s", backend.location, key, error)
            continue
        if record is not None:
            aliases[alias] = record
    return aliases


def resolve(registry: Registry, reference: str | ModelReference) -> Registration:
    """The registration a reference names: ``name`` (latest), ``name/3`` or ``name@production``."""
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    backend = _backend(registry)
    if ref.alias:
        record = _alias(backend, ref.name, ref.alias)
        if record is None:
            known = sorted(read_aliases(backend, ref.name))
            raise ModelNotFoundError(f"{ref.name} has no alias {ref.alias!r} in {backend.location}; "
                                     f"aliases: {known or 'none'}")  # fmt: skip
        return read_registration(backend, ref.name, record.version)
    if ref.version is not None:
        return read_registration(backend, ref.name, ref.version)
    latest = next(_registrations(backend, ref.name, newest_first=True), None)
    if latest is None:
        raise ModelNotFoundError(f"no model named {ref.name!r} in {backend.location}")
    return latest


def _move_alias(
    backend: RegistryBackend, name: str, alias: str, version: int, should_move: Callable[[AliasRecord | None], bool],
    repair: bool = False,
) -> AliasRecord | None:  # fmt: skip
    """Compare-and-swap ``alias`` to ``version`` while ``should_move(current)`` holds; None when it does not.
    With ``repair`` an unreadable alias record is replaced (with a warning) instead of refused."""
    key = alias_key(name, alias)
    for attempt in range(ALIAS_SWAP_ATTEMPTS):
        tagged = backend.read_tagged(key)
        try:
            current = parse_alias(tagged[0], f"{backend.location}/{key}", name, alias) if tagged else None
        except CorruptRegistryRecordError as error:
            if not repair:
                raise
            logger.warning("%s: replacing it", error)
            current = None
        if not should_move(current):
            return None
        record = AliasRecord(alias=alias, version=version, updated_at=datetime.now(timezone.utc),
                             previous_version=current.version if current else None)  # fmt: skip
        data = record.model_dump_json(indent=2).encode()
        # A lost answer to our own successful write reads back as our bytes.
        if backend.replace_if(key, data, tagged[1] if tagged else None) or backend.read(key) == data:
            return record
        time.sleep(random.uniform(0, min(1.0, 0.02 * 2**attempt)))
    raise TimeoutError(f"{backend.location}/{key} kept changing under {ALIAS_SWAP_ATTEMPTS} attempts to move it")


def set_alias(registry: Registry, name: str, alias: str, version: int) -> AliasRecord:
    """Point ``alias`` at a committed version (creating or moving it; an unreadable alias record is replaced)."""
    backend = _backend(registry)
    check_alias(alias)
    read_registration(backend, name, version)
    record = _move_alias(backend, name, alias, version, lambda _: True, repair=True)
    assert record is not None
    return record


def check_metric(metrics: dict[str, Any], metric: str) -> float:
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        numeric = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise PipelineInputError(f"promotion metric {metric!r} is not among this model's figures: {numeric}")
    return float(value)


def _judge(backend: RegistryBackend, name: str, alias: str, metric: str, value: float, current: AliasRecord | None,
           version: int | None = None) -> Promotion:  # fmt: skip
    """Champion/challenger against the alias as it is now: an alias not yet set (or already on ``version``)
    is taken; otherwise only by beating the champion strictly (higher is better). A champion without the
    figure keeps the alias: nothing shows the challenger is better."""
    if current is None:
        return Promotion(alias=alias, metric=metric, challenger=value, champion_version=None, champion=None, promoted=True)
    if current.version == version:  # a retry finding its own earlier promotion
        return Promotion(alias=alias, metric=metric, challenger=value, champion_version=version, champion=value,
                         promoted=True)  # fmt: skip
    best = read_registration(backend, name, current.version).metrics.get(metric)
    best = float(best) if isinstance(best, (int, float)) and not isinstance(best, bool) else None
    return Promotion(alias=alias, metric=metric, challenger=value, champion_version=current.version, champion=best,
                     promoted=best is not None and value > best)  # fmt: skip


def challenge(registry: Registry, name: str, alias: str, metric: str, metrics: dict[str, Any]) -> Promotion:
    """Should a version with ``metrics`` take ``alias`` now? (See ``_judge``.)"""
    backend = _backend(registry)
    return _judge(backend, name, alias, metric, check_metric(metrics, metric), _alias(backend, name, check_alias(alias)))


def _promote(backend: RegistryBackend, registration: Registration, alias: str, metric: str) -> Promotion:
    """Move ``alias`` to the version if it beats the champion, judged again after every lost swap."""
    value = check_metric(registration.metrics, metric)
    verdict: list[Promotion] = []

    def beats(current: AliasRecord | None) -> bool:
        verdict.append(_judge(backend, registration.name, alias, metric, value, current, registration.version))
        return verdict[-1].promoted and (current is None or current.version != registration.version)

    _move_alias(backend, registration.name, alias, registration.version, beats)
    return verdict[-1]


def _hash_model_files(model_dir: ModelDirectory) -> dict[str, str]:
    """sha256 of each file a version carries; refuses (before any version is claimed) a folder missing one."""
    names = [*MODEL_FILES, *([ONNX_FILE] if (model_dir.root / ONNX_FILE).is_file() else [])]
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


def _committed_by(backend: RegistryBackend, name: str, flow_run_id: str | None, task_run_id: str | None,
                  files: dict[str, str]) -> Registration | None:  # fmt: skip
    if not flow_run_id:
        return None
    return next((r for r in _registrations(backend, name, newest_first=True)
                 if (r.flow_run_id, r.task_run_id, r.files) == (flow_run_id, task_run_id, files)), None)  # fmt: skip


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
    task_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    promote_to: str | None = None,
    promotion_metric: str = "accuracy",
) -> tuple[Registration, str]:
    """Store a trained model as the next version of ``name``; returns its record and location.

    With ``flow_run_id`` (and ``task_run_id``) the call is idempotent: a version that run already committed
    with the same files is returned, not registered again. With ``promote_to``, the version takes that alias
    if it beats the alias's current version on ``promotion_metric``; the returned record carries the final
    verdict (``registration.json`` keeps the one made at commit time).
    """
    backend = _backend(registry)
    check_model_name(name)
    if promote_to:
        check_alias(promote_to)
        check_metric(metrics, promotion_metric)
    files = _hash_model_files(model_dir)
    registration = _committed_by(backend, name, flow_run_id, task_run_id, files)
    if registration is None:
        claim = Claim(token=uuid.uuid4().hex, created_at=datetime.now(timezone.utc), host=socket.gethostname(),
                      pid=os.getpid())  # fmt: skip
        version = _claim_version(backend, name, claim.model_dump_json().encode())
        for file_name in files:
            backend.upload(version_key(name, version, file_name), model_dir.root / file_name)
        registration = Registration(
            name=name, version=version, created_at=datetime.now(timezone.utc), metrics=metrics, params=params,
            datasets=datasets, flow_run_id=flow_run_id, task_run_id=task_run_id, tags=tags or {}, files=files,
            promotion=challenge(backend, name, promote_to, promotion_metric, metrics) if promote_to else None,
        )  # fmt: skip
        record = registration.model_dump_json(indent=2).encode()
        if not _create_owned(backend, version_key(name, version, REGISTRATION_FILE), record):
            raise RuntimeError(f"{backend.location}/{name}/{version} was committed by another registration despite our claim")
    if promote_to:
        promotion = _promote(backend, registration, promote_to, promotion_metric)
        registration = registration.model_copy(update={"promotion": promotion})
    return registration, f"{backend.location}/{version_key(name, registration.version)}"


def _integrity_message(where: str, wrong: dict[str, str], registration: Registration) -> str:
    found = "; ".join(f"{f}: {what}, registered {registration.files[f]}" for f, what in wrong.items())
    return f"{where} does not hold what version {registration.version} of {registration.name} registered ({found})"


def _discard(folder: Path) -> None:
    """Remove a cached copy found damaged; renamed away first so that no reader meets it half deleted."""
    trash = folder.parent / f".{folder.name}.discarded-{uuid.uuid4().hex}"
    try:
        folder.rename(trash)
    except FileNotFoundError:
        return  # another fetch discarded it first
    shutil.rmtree(trash, ignore_errors=True)


def _download(backend: RegistryBackend, registration: Registration, target: Path, memo: Path) -> None:
    folder = version_key(registration.name, registration.version)
    target.parent.mkdir(parents=True, exist_ok=True)
    download = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.download-"))
    try:
        for file_name in registration.files:
            backend.download(f"{folder}/{file_name}", download / file_name)
        hashes = {f: sha256_file(download / f) for f in registration.files}
        wrong = {f: f"sha256 {h}" for f, h in hashes.items() if h != registration.files[f]}
        if wrong:
            raise ModelIntegrityError(_integrity_message(f"{backend.location}/{folder}", wrong, registration))
        (download / REGISTRATION_FILE).write_text(registration.model_dump_json(indent=2), encoding="utf-8")
        # Versions never change, so when several fetches race, the first complete copy stays and the
        # others are dropped: rename() refuses to replace a folder that is not empty.
        os.rename(download, target)
        remember(target, registration.files, memo)
    except OSError:
        if not (target / REGISTRATION_FILE).is_file():
            raise
    finally:
        shutil.rmtree(download, ignore_errors=True)


def fetch_model(registry: Registry, reference: str, cache_dir: str | os.PathLike[str]) -> ModelDirectory:
    """A local ModelDirectory for a reference, its files checked against the sha256 recorded at registration
    (hashes memoised per file in ``cache_dir``): the version folder itself on a local registry (refused when
    it differs), otherwise a download into ``cache_dir/<name>/<version>`` (downloaded again when it differs)."""
    backend = _backend(registry)
    registration = resolve(backend, reference)
    folder = version_key(registration.name, registration.version)
    memo = memo_path(cache_dir, registration.name, registration.version)
    if isinstance(backend, LocalBackend):
        wrong = mismatched_files(backend.root / folder, registration.files, memo)
        if wrong:
            raise ModelIntegrityError(_integrity_message(f"{backend.location}/{folder}", wrong, registration))
        return ModelDirectory(backend.root / folder)
    target = Path(cache_dir) / folder
    if (target / REGISTRATION_FILE).is_file():
        wrong = mismatched_files(target, registration.files, memo)
        if not wrong:
            return ModelDirectory(target)
        logger.warning("%s; downloading it again", _integrity_message(f"cached copy {target}", wrong, registration))
        _discard(target)
    _download(backend, registration, target, memo)
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
