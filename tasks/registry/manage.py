"""What people do to a registry after registration: list models and versions, show one, tag, archive,
delete, search. Every change goes through the same compare-and-swap as aliases (``backends.swap``), on
``status.json`` (see ``status.py``); ``registration.json`` is never rewritten.

Deleting a version is safe against an alias moving onto it at the same time: the deletion marks the version
deleted first and reads its aliases after; an alias move writes first and reads the mark after
(``core._move_alias``). Of two such racing, at least one sees the other and backs off.
"""

from __future__ import annotations

import operator
import re
from typing import Any

from pydantic import BaseModel

from tasks.contracts.registry_layout import (
    REGISTERED_FILES,
    REGISTRATION_FILE,
    Approval,
    ModelReference,
    Registration,
    VersionStatus,
    closest_first,
    version_key,
)
from tasks.errors import AliasedVersionError, InvalidQueryError
from tasks.registry.core import (
    Registry,
    backend_of,
    model_names,
    read_aliases,
    read_registration,
    registrations,
    resolve,
    versions_with_status,
)
from tasks.registry.status import change_status, read_status

_CONDITION = re.compile(r"\s*(?P<metric>[A-Za-z0-9_.-]+)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>[-+0-9.eE]+)\s*")
_OPERATORS = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
}
_TAG_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class VersionView(BaseModel):
    """A committed version as people see it: its registration and what was changed since."""

    registration: Registration
    tags: dict[str, str]
    archived: bool
    aliases: list[str]
    approval: Approval | None = None

    @property
    def reference(self) -> str:
        return f"{self.registration.name}/{self.registration.version}"


class Condition(BaseModel):
    metric: str
    op: str
    value: float

    def holds(self, metrics: dict[str, Any]) -> bool:
        figure = metrics.get(self.metric)
        return (
            isinstance(figure, (int, float))
            and not isinstance(figure, bool)
            and _OPERATORS[self.op](figure, self.value)
        )

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_condition(text: str) -> Condition:
    """``accuracy>=0.9``, ``log_loss<0.2``: a figure, a comparison and a number."""
    match = _CONDITION.fullmatch(text)
    try:
        return Condition(metric=match["metric"], op=match["op"], value=float(match["value"]))  # type: ignore[index]
    except (TypeError, ValueError):
        raise InvalidQueryError(
            f"search condition {text!r} is not allowed: use <figure><op><number> with op one of "
            f"{', '.join(_OPERATORS)} (e.g. 'accuracy>=0.9', 'log_loss<0.3')"
        ) from None


def parse_tags(pairs: list[str]) -> dict[str, str]:
    """``["team=vision", "data=v2"]`` -> ``{"team": "vision", "data": "v2"}``."""
    tags = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not _TAG_KEY.fullmatch(key):
            raise InvalidQueryError(
                f"tag {pair!r} is not allowed: use key=value, the key 1-64 letters, digits, "
                "'_', '.' or '-' (e.g. 'team=vision')"
            )
        tags[key] = value
    return tags


def list_models(registry: Registry) -> list[str]:
    """Names with at least one committed, undeleted version."""
    backend = backend_of(registry)
    return [name for name in model_names(backend) if next(registrations(backend, name), None)]


def _view(registration: Registration, status: VersionStatus | None, aliases: dict[str, int]) -> VersionView:
    return VersionView(
        registration=registration,
        tags=status.tags if status else registration.tags,
        archived=bool(status and status.archived),
        approval=status.approval if status else None,
        aliases=sorted(a for a, v in aliases.items() if v == registration.version),
    )


def model_versions(registry: Registry, name: str) -> list[VersionView]:
    """Every committed version of ``name``, archived ones included, oldest first."""
    backend = backend_of(registry)
    aliases = {a: r.version for a, r in read_aliases(backend, name).items()}
    return [_view(record, status, aliases) for record, status in versions_with_status(backend, name)]


def show_version(registry: Registry, reference: str | ModelReference) -> VersionView:
    backend = backend_of(registry)
    registration = resolve(backend, reference)
    status = read_status(backend, registration.name, registration.version)
    return _view(registration, status, {a: r.version for a, r in read_aliases(backend, registration.name).items()})


def tag(registry: Registry, reference: str, tags: dict[str, str]) -> VersionView:
    """Add or overwrite ``tags`` on a version."""
    registration = resolve(registry, reference)
    change_status(backend_of(registry), registration, lambda s: s.model_copy(update={"tags": {**s.tags, **tags}}))
    return show_version(registry, f"{registration.name}/{registration.version}")


def untag(registry: Registry, reference: str, keys: list[str]) -> VersionView:
    """Remove the tags named ``keys`` (absent ones are ignored)."""
    registration = resolve(registry, reference)
    change_status(
        backend_of(registry),
        registration,
        lambda s: s.model_copy(update={"tags": {k: v for k, v in s.tags.items() if k not in keys}}),
    )
    return show_version(registry, f"{registration.name}/{registration.version}")


def archive(registry: Registry, reference: str, archived: bool = True) -> VersionView:
    """Archive a version (left out of ``latest``, still fetchable by number and alias), or bring it back."""
    registration = resolve(registry, reference)
    change_status(backend_of(registry), registration, lambda s: s.model_copy(update={"archived": archived}))
    return show_version(registry, f"{registration.name}/{registration.version}")


def _aliases_on(backend, name: str, version: int) -> list[str]:
    return sorted(a for a, r in read_aliases(backend, name).items() if r.version == version)


def _refuse_aliased(backend, registration: Registration, aliases: list[str]) -> AliasedVersionError:
    ref = f"{registration.name}/{registration.version}"
    return AliasedVersionError(
        f"{ref} cannot be deleted from {backend.location}: alias {', '.join(aliases)} points at it; move the alias "
        f"to another version or unset it first (image-classifier registry alias unset {registration.name} {aliases[0]})"
    )


def delete_version(registry: Registry, name: str, version: int) -> Registration:
    """Delete a version no alias points at; its number is never used again. Refused with
    ``AliasedVersionError`` while an alias points at it."""
    backend = backend_of(registry)
    registration = read_registration(backend, name, version)
    if aliases := _aliases_on(backend, name, version):
        raise _refuse_aliased(backend, registration, aliases)
    change_status(backend, registration, lambda s: s.model_copy(update={"deleted": True}))
    if aliases := _aliases_on(backend, name, version):  # an alias moved here while we were marking it
        change_status(backend, registration, lambda s: s.model_copy(update={"deleted": False}), refuse_deleted=False)
        raise _refuse_aliased(backend, registration, aliases)
    # The record first: from then on the version is gone even if removing its files is cut short.
    backend.delete(version_key(name, version, REGISTRATION_FILE))
    for file_name in sorted(REGISTERED_FILES & set(registration.files)):
        backend.delete(version_key(name, version, file_name))
    return registration


def search(
    registry: Registry,
    tags: dict[str, str] | None = None,
    where: list[Condition] | None = None,
    names: list[str] | None = None,
    include_archived: bool = False,
) -> list[VersionView]:
    """Versions (of ``names``, default every model) carrying all ``tags`` and meeting every ``where`` condition.

    A condition on a figure no version records (``acc>=0.9``) is refused, naming the figures there are."""
    found, figures = [], set()
    for name in names or list_models(registry):
        for view in model_versions(registry, name):
            figures |= {k for k, v in view.registration.metrics.items() if isinstance(v, (int, float))}
            if view.archived and not include_archived:
                continue
            if all(view.tags.get(k) == v for k, v in (tags or {}).items()) and all(
                c.holds(view.registration.metrics) for c in where or []
            ):
                found.append(view)
    unknown = [c.metric for c in where or [] if c.metric not in figures]
    if unknown and figures:
        close, listed = closest_first(unknown[0], sorted(figures), cutoff=0.4)
        raise InvalidQueryError(
            f"no version records the figure {unknown[0]!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; figures: {', '.join(listed)}"
        )
    return found
