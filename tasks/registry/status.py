"""A committed version's changeable state (``status.json``): tags, archived, deleted.

``registration.json`` is written once; tags and the archived flag change later, by compare-and-swap
(``backends.swap``), so two people tagging one version at once both keep their tag. A version without a
status record has its registration's tags and is neither archived nor deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from tasks.contracts.registry_layout import STATUS_FILE, Registration, VersionStatus, parse_status, version_key
from tasks.errors import ModelNotFoundError
from tasks.registry.backends import RegistryBackend, swap


def read_status(backend: RegistryBackend, name: str, version: int) -> VersionStatus | None:
    key = version_key(name, version, STATUS_FILE)
    data = backend.read(key)
    return None if data is None else parse_status(data, f"{backend.location}/{key}")


def is_deleted(backend: RegistryBackend, name: str, version: int) -> bool:
    status = read_status(backend, name, version)
    return status is not None and status.deleted


def change_status(
    backend: RegistryBackend,
    registration: Registration,
    change: Callable[[VersionStatus], VersionStatus],
    refuse_deleted: bool = True,
) -> VersionStatus:
    """Apply ``change`` to the version's current status by compare-and-swap; a deleted version is refused
    (``ModelNotFoundError``) unless ``refuse_deleted`` is False (a deletion taking its mark back)."""
    key = version_key(registration.name, registration.version, STATUS_FILE)
    where = f"{backend.location}/{key}"

    def changed(current: bytes | None) -> bytes:
        status = (
            parse_status(current, where)
            if current
            else VersionStatus(tags=registration.tags, updated_at=registration.created_at)
        )
        if status.deleted and refuse_deleted:
            raise ModelNotFoundError(f"{registration.name}/{registration.version} was deleted from {backend.location}")
        new = change(status.model_copy(deep=True)).model_copy(update={"updated_at": datetime.now(timezone.utc)})
        return new.model_dump_json(indent=2).encode()

    data = swap(backend, key, changed)
    assert data is not None
    return parse_status(data, where)
