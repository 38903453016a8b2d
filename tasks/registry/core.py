"""Registry operations over any backend: list, read, resolve references, move aliases. Registering is
tasks/registry/registering.py, the champion/challenger judgement tasks/registry/promotion.py.

Readers only ever see committed versions (a ``registration.json`` is created after every file it names).

An alias moves by compare-and-swap: read it (with its tag), judge, write only if it is unchanged, else
read and judge again; so of two promotions racing, the later write has seen the earlier one.

Every record read back is checked (``registry_layout.parse_registration`` / ``parse_alias``) before its contents
become paths; a corrupt version is left out of listings and of ``latest`` with a warning.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.registry_layout import (
    ALIASES_FOLDER,
    REGISTRATION_FILE,
    AliasRecord,
    DatasetLineage,
    ModelReference,
    Registration,
    VersionStatus,
    alias_key,
    check_alias,
    check_model_name,
    closest_first,
    is_model_name,
    parse_alias,
    parse_reference,
    parse_registration,
    version_key,
    version_numbers,
)
from tasks.errors import (
    CorruptRegistryRecordError,
    InvalidModelNameError,
    ModelNotFoundError,
)
from tasks.registry.backends import RegistryBackend, swap
from tasks.registry.locations import open_backend
from tasks.registry.status import is_deleted, read_status

Registry = str | os.PathLike[str] | RegistryBackend
logger = logging.getLogger(__name__)


def backend_of(registry: Registry) -> RegistryBackend:
    return registry if isinstance(registry, RegistryBackend) else open_backend(registry)


def _create_owned(backend: RegistryBackend, key: str, data: bytes) -> bool:
    """Exclusive create that survives a lost answer: when a retried write finds the key taken, the key
    may hold our own first attempt, which counts as ours."""
    return backend.create_exclusive(key, data) or backend.read(key) == data


def lineage(image_dir: str | os.PathLike[str]) -> DatasetLineage:
    """What a registration records of a data set: its source, content hash and size."""
    manifest = ImageDirectory(image_dir).manifest
    return DatasetLineage(
        source=manifest.source, content_hash=manifest.content_hash, images=manifest.image_count, split=manifest.split
    )


def _record(backend: RegistryBackend, name: str, version: int) -> Registration | None:
    """The checked record of a version; None while it is not committed."""
    key = version_key(name, version, REGISTRATION_FILE)
    data = backend.read(key)
    return None if data is None else parse_registration(data, f"{backend.location}/{key}", name, version)


def versions_with_status(
    backend: RegistryBackend,
    name: str,
    newest_first: bool = False,
    include_archived: bool = True,
    strict: bool = False,
) -> Iterator[tuple[Registration, VersionStatus | None]]:
    """Committed, undeleted versions of ``name`` with their status record (None: never changed); corrupt ones
    are left out with a warning (``strict``: raise ``CorruptRegistryRecordError``, which names the file)."""
    versions = version_numbers(backend.list_keys(check_model_name(name)), name, REGISTRATION_FILE)
    for version in sorted(versions, reverse=newest_first):
        try:
            record = _record(backend, name, version)
            status = read_status(backend, name, version) if record else None
        except CorruptRegistryRecordError as error:
            if strict:
                raise
            logger.warning("%s: this version is left out", error)
            continue
        if record is not None and not (status and (status.deleted or (status.archived and not include_archived))):
            yield record, status


def registrations(
    backend: RegistryBackend, name: str, newest_first: bool = False, include_archived: bool = True
) -> Iterator[Registration]:
    """Committed, undeleted versions of ``name`` (see ``versions_with_status``)."""
    return (record for record, _ in versions_with_status(backend, name, newest_first, include_archived))


def list_versions(registry: Registry, name: str, include_archived: bool = True) -> list[int]:
    """Committed, readable versions of ``name``, oldest first."""
    return [r.version for r in registrations(backend_of(registry), name, include_archived=include_archived)]


def read_registration(registry: Registry, name: str, version: int) -> Registration:
    backend = backend_of(registry)
    record = _record(backend, check_model_name(name), version)
    if record is None or is_deleted(backend, name, version):
        if not _holds_versions(backend, name):
            raise ModelNotFoundError(no_model_message(backend, name))
        committed = list_versions(backend, name)
        raise ModelNotFoundError(
            f"{name} has no version {version} in {backend.location}; committed versions: {committed or 'none'}"
        )
    return record


def _holds_versions(backend: RegistryBackend, name: str) -> bool:
    """Whether ``name`` has any version record at all (committed, archived or damaged)."""
    return bool(version_numbers(backend.list_keys(check_model_name(name)), name, REGISTRATION_FILE))


def _alias(backend: RegistryBackend, name: str, alias: str) -> AliasRecord | None:
    key = alias_key(name, alias)
    data = backend.read(key)
    record = None if data is None else parse_alias(data, f"{backend.location}/{key}", name, alias)
    return record if record is not None and record.version is not None else None


def read_aliases(registry: Registry, name: str) -> dict[str, AliasRecord]:
    """The aliases of ``name``; unreadable alias files are left out with a warning."""
    backend = backend_of(registry)
    aliases = {}
    for key in backend.list_keys(f"{check_model_name(name)}/{ALIASES_FOLDER}"):
        alias = key.rsplit("/", 1)[-1].removesuffix(".json")
        try:
            record = _alias(backend, name, check_alias(alias))
        except (CorruptRegistryRecordError, InvalidModelNameError) as error:
            logger.warning("%s/%s: alias left out: %s", backend.location, key, error)
            continue
        if record is not None:  # None: unset
            aliases[alias] = record
    return aliases


def resolve(registry: Registry, reference: str | ModelReference) -> Registration:
    """The registration a reference names: ``name`` (latest), ``name/3`` or ``name@production``."""
    ref = parse_reference(reference) if isinstance(reference, str) else reference
    backend = backend_of(registry)
    if ref.alias:
        record = _alias(backend, ref.name, ref.alias)
        if record is None:
            if not _holds_versions(backend, ref.name):
                raise ModelNotFoundError(no_model_message(backend, ref.name))
            known = sorted(read_aliases(backend, ref.name))
            raise ModelNotFoundError(
                f"{ref.name} has no alias {ref.alias!r} in {backend.location}; aliases: {known or 'none'}"
            )
        return read_registration(backend, ref.name, record.version)
    if ref.version is not None:
        return read_registration(backend, ref.name, ref.version)
    # strict: a damaged newest record fails (naming its file) rather than quietly resolving an older version.
    newest = versions_with_status(backend, ref.name, newest_first=True, include_archived=False, strict=True)
    latest = next((record for record, _ in newest), None)
    if latest is None:
        archived = list_versions(backend, ref.name)
        if archived:
            raise ModelNotFoundError(
                f"{ref.name!r} has only archived versions in {backend.location} ({archived}): name one by number"
            )
        raise ModelNotFoundError(no_model_message(backend, ref.name))
    return latest


def model_names(registry: Registry) -> list[str]:
    """Names holding at least one version record (read from the listing alone: cheap)."""
    backend = backend_of(registry)
    keys = backend.list_keys("")
    names = sorted({key.split("/", 1)[0] for key in keys if is_model_name(key.split("/", 1)[0])})
    return [name for name in names if version_numbers(keys, name, REGISTRATION_FILE)]


def no_model_message(registry: Registry, name: str) -> str:
    """ "no model named X in R; models: ..." with the closest names first (difflib)."""
    backend = backend_of(registry)
    known = model_names(backend)
    if not known:
        return f"no model named {name!r} in {backend.location}: it holds no models yet (check --registry)"
    close, ordered = closest_first(name, known)
    shown = ", ".join(ordered[:10]) + (f" and {len(ordered) - 10} more" if len(ordered) > 10 else "")
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"no model named {name!r} in {backend.location}{hint}; models: {shown}"


def _move_alias(
    backend: RegistryBackend,
    name: str,
    alias: str,
    version: int | None,
    should_move: Callable[[AliasRecord | None], bool],
    repair: bool = False,
) -> AliasRecord | None:
    """Compare-and-swap ``alias`` to ``version`` (None: unset it) while ``should_move(current)`` holds; None when
    it does not. With ``repair`` an unreadable alias record is replaced (with a warning) instead of refused.

    A version being deleted is marked first and its aliases checked after (``manage.delete_version``); here the
    alias is written first and the mark checked after, so of a deletion and a move racing, at least one sees
    the other: a move that finds the mark takes itself back."""
    key = alias_key(name, alias)
    where = f"{backend.location}/{key}"
    moved: list[AliasRecord] = []

    def change(data: bytes | None) -> bytes | None:
        try:
            current = parse_alias(data, where, name, alias) if data else None
        except CorruptRegistryRecordError as error:
            if not repair:
                raise
            logger.warning("%s: replacing it", error)
            current = None
        current = current if current is not None and current.version is not None else None
        if not should_move(current):
            return None
        moved.append(
            AliasRecord(
                alias=alias,
                version=version,
                updated_at=datetime.now(timezone.utc),
                previous_version=current.version if current else None,
            )
        )
        return moved[-1].model_dump_json(indent=2).encode()

    written = swap(backend, key, change)
    if written is None:
        return None
    record = moved[-1]
    if version is not None and is_deleted(backend, name, version):
        back = AliasRecord(
            alias=alias,
            version=record.previous_version,
            updated_at=datetime.now(timezone.utc),
            previous_version=version,
        )
        swap(backend, key, lambda data: back.model_dump_json(indent=2).encode() if data == written else None)
        raise ModelNotFoundError(
            f"{name}/{version} is being deleted from {backend.location}: alias {alias!r} not moved"
        )
    return record


def set_alias(registry: Registry, name: str, alias: str, version: int) -> AliasRecord:
    """Point ``alias`` at a committed version (creating or moving it; an unreadable alias record is replaced)."""
    backend = backend_of(registry)
    check_alias(alias)
    read_registration(backend, name, version)
    record = _move_alias(backend, name, alias, version, lambda _: True, repair=True)
    assert record is not None
    return record


def unset_alias(registry: Registry, name: str, alias: str) -> AliasRecord:
    """Remove ``alias`` (its record stays, pointing nowhere, with the version it pointed at as previous)."""
    backend = backend_of(registry)
    record = _move_alias(backend, name, check_alias(alias), None, lambda current: current is not None, repair=True)
    if record is None:
        known = sorted(read_aliases(backend, name))
        raise ModelNotFoundError(f"{name} has no alias {alias!r} in {backend.location}; aliases: {known or 'none'}")
    return record
