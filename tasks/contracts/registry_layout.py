"""The registry contract: names, references, records and where each lives, the same on disk and on S3.

Layout (keys below the registry root, a folder or ``s3://bucket/prefix``)::

    <name>/<version>/claim.json          created exclusively: this registration owns <version>
    <name>/<version>/model.pt, model_spec.json, classes.json, metrics.json, training_log.csv[, model.onnx]
    <name>/<version>/registration.json   created exclusively, last: its presence commits the version
    <name>/<version>/status.json         VersionStatus: tags, archived, deleted, approval (changed by
                                         compare-and-swap)
    <name>/aliases/<alias>.json          AliasRecord: which version the alias points at (moved by rewriting;
                                         unset: version null, so that unsetting is a swap like moving)

Versions count 1, 2, 3... per name. A registration claims the next free number, uploads the model files
under it, then commits. A number with a claim and no ``registration.json`` is an interrupted registration:
never listed, never resolved, never reused. ``registration.json`` never changes; what people change later
(tags, archived) is ``status.json``. A deleted version keeps its claim and a ``deleted`` status, so its number
is not reused either.

References, accepted everywhere a model is taken: ``name`` (latest version), ``name/3``, ``name@production``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from tasks.contracts.image_manifest import SplitRecord
from tasks.contracts.model_directory import MODEL_FILES, OPTIONAL_FILES
from tasks.errors import CorruptRegistryRecordError, InvalidModelNameError

CLAIM_FILE = "claim.json"
REGISTRATION_FILE = "registration.json"
STATUS_FILE = "status.json"
ALIASES_FOLDER = "aliases"
# The only file names a version may hold: a record naming any other is refused before it becomes a path.
REGISTERED_FILES = frozenset({*MODEL_FILES, *OPTIONAL_FILES})
# Always matched whole (re.fullmatch): "$" would also accept a trailing newline.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
_ALIAS = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_VERSION = re.compile(r"[1-9][0-9]{0,17}")
_REFERENCE = re.compile(r"(?P<name>[^/@]+)(?:/(?P<version>[0-9]+)|@(?P<alias>[^/@]+))?")


class DatasetLineage(BaseModel):
    source: str
    content_hash: str = Field(description="ImageDirectoryManifest.content_hash")
    images: int
    split: SplitRecord | None = Field(None, description="the split this data set is one side of; None: not split")


class Approval(BaseModel):
    """A person's answer to "move ``alias`` to this version?" (or the lack of one, ``timed out``).

    Prefect's open-source server has no user accounts: ``reviewer`` is the name typed into the form, and
    ``answered_at`` the server's time of the resume (or of the timeout)."""

    decision: Literal["approved", "rejected", "timed out"]
    reviewer: str = ""
    comment: str = ""
    answered_at: datetime
    flow_run_id: str | None = Field(default=None, description="the paused flow run that asked")


class Promotion(BaseModel):
    """A champion/challenger decision: was this version moved to ``alias``, and why."""

    alias: str
    metric: str
    challenger: float
    champion_version: int | None
    champion: float | None
    promoted: bool
    lower_is_better: bool = False
    min_improvement: float = 0.0
    awaiting_approval: bool = Field(default=False, description="it beats the champion; a person decides the move")
    approval: Approval | None = None


class Registration(BaseModel):
    name: str
    version: int
    created_at: datetime
    metrics: dict[str, Any]
    params: dict[str, Any]
    datasets: dict[str, DatasetLineage]
    flow_run_id: str | None = None
    task_run_id: str | None = Field(default=None, description="with flow_run_id: a retried task finds its own version")
    training_run_id: str | None = Field(
        default=None,
        description="the flow run that began this training: flow_run_id, or the first of the runs it replaced "
        "(their hosts lost); one training, one version",
    )
    tags: dict[str, str] = {}
    files: dict[str, str] = Field(description="file name -> sha256")
    promotion: Promotion | None = Field(default=None, description="the champion/challenger verdict at commit time")


class Claim(BaseModel):
    token: str = Field(description="unique per registration attempt: tells our own claim from another's")
    created_at: datetime
    host: str
    pid: int


class VersionStatus(BaseModel):
    """What people change about a committed version after registration."""

    tags: dict[str, str]
    archived: bool = Field(default=False, description="left out of 'latest'; still fetchable by number")
    deleted: bool = Field(default=False, description="set before the files are removed: hidden from then on")
    approval: Approval | None = Field(default=None, description="a person's answer to its promotion")
    updated_at: datetime


class AliasRecord(BaseModel):
    alias: str
    version: int | None = Field(description="None: the alias was unset")
    updated_at: datetime
    previous_version: int | None = None


@dataclass(frozen=True)
class ModelReference:
    name: str
    version: int | None = None
    alias: str | None = None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}/{self.version}"
        return f"{self.name}@{self.alias}" if self.alias else self.name


_SHA256 = re.compile(r"[0-9a-f]{64}")


def parse_registration(data: bytes, where: str, name: str, version: int) -> Registration:
    """The record of ``where`` (``<registry>/<name>/<version>/registration.json``), checked to be about
    that version and to name only allowed files, before any of it becomes a path."""
    try:
        record = Registration.model_validate_json(data)
    except ValueError as error:
        raise CorruptRegistryRecordError(
            f"{where} (model {name}, version {version}) is not a readable registration record: {error}"
        ) from error
    claimed = (record.name, record.version)
    problems = [f"it says it is {record.name}/{record.version}"] if claimed != (name, version) else []
    problems += [
        f"file {f!r} is not one a version may hold ({', '.join(sorted(REGISTERED_FILES))})"
        for f in record.files
        if f not in REGISTERED_FILES
    ]
    problems += [
        f"file {f!r} has no sha256 hex digest ({h!r})" for f, h in record.files.items() if not _SHA256.fullmatch(h)
    ]
    if problems:
        raise CorruptRegistryRecordError(f"{where} (model {name}, version {version}) is refused: {'; '.join(problems)}")
    return record


def parse_alias(data: bytes, where: str, name: str, alias: str) -> AliasRecord:
    """The alias record of ``where``, checked to be about ``alias`` and to point at a plausible version."""
    try:
        record = AliasRecord.model_validate_json(data)
    except ValueError as error:
        raise CorruptRegistryRecordError(
            f"{where} (model {name}, alias {alias}) is not a readable alias record: {error}"
        ) from error
    if record.alias != alias or (record.version is not None and record.version < 1):
        raise CorruptRegistryRecordError(
            f"{where} (model {name}, alias {alias}) is refused: it says alias {record.alias!r} -> version {record.version}"
        )
    return record


def parse_status(data: bytes, where: str) -> VersionStatus:
    try:
        return VersionStatus.model_validate_json(data)
    except ValueError as error:
        raise CorruptRegistryRecordError(f"{where} is not a readable version status record: {error}") from error


def is_model_name(name: str) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_model_name(name: str) -> str:
    if not is_model_name(name):
        raise InvalidModelNameError(
            f"model name {name!r} is not allowed: use 1-100 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. 'digits-resnet18')"
        )
    return name


def check_alias(alias: str) -> str:
    if not isinstance(alias, str) or not _ALIAS.fullmatch(alias):
        raise InvalidModelNameError(
            f"alias {alias!r} is not allowed: use 1-63 lowercase letters, digits, '_' or '-', "
            "starting with a letter (e.g. 'production', 'staging')"
        )
    return alias


def parse_reference(reference: str) -> ModelReference:
    """``digits-resnet18``, ``digits-resnet18/3`` or ``digits-resnet18@production``."""
    match = _REFERENCE.fullmatch(reference.strip())
    if not match:
        raise InvalidModelNameError(
            f"model reference {reference!r} is not allowed: use 'name', 'name/<version>' or 'name@<alias>' "
            "(e.g. 'digits-resnet18/3', 'digits-resnet18@production')"
        )
    version = match["version"]
    alias = check_alias(match["alias"]) if match["alias"] else None
    if version is not None and int(version) < 1:
        raise InvalidModelNameError(f"model reference {reference!r}: versions count from 1")
    return ModelReference(check_model_name(match["name"]), int(version) if version else None, alias)


def reference_or_folder(model: str) -> ModelReference | None:
    """What a command's MODEL names: None for an existing folder (a ModelDirectory), else its registry reference;
    one that is neither is refused in one line."""
    if Path(model).is_dir():
        return None
    try:
        return parse_reference(model)
    except InvalidModelNameError as error:
        raise InvalidModelNameError(
            f"{model!r} is neither a model directory nor a registry reference: {error}"
        ) from None


def default_model_name(train_source: str, architecture: str) -> str:
    """``<data set>-<architecture>``, the data set named by the training folder (or its parent for
    ``.../train``), e.g. ``data/digits/train`` + resnet18 -> ``digits-resnet18``."""
    source = Path(train_source)
    stem = source.name.split(".")[0]
    if stem.lower() in {"train", "training", "trainset"} and source.parent.name:
        stem = source.parent.name
    slug = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._") or "images"
    return check_model_name(f"{slug}-{architecture}"[:100])


def version_key(name: str, version: int, file_name: str = "") -> str:
    return "/".join(p for p in (check_model_name(name), str(version), file_name) if p)


def alias_key(name: str, alias: str) -> str:
    return f"{check_model_name(name)}/{ALIASES_FOLDER}/{check_alias(alias)}.json"


def version_numbers(keys: list[str], name: str, file_name: str | None = None) -> set[int]:
    """The versions of ``name`` among ``keys`` (relative to the registry root) that hold ``file_name``
    (any file when None)."""
    found = set()
    for key in keys:
        parts = key.split("/")
        # str.isdigit() would take "²" or "٣"; a version folder is plain ASCII digits.
        if (
            len(parts) >= 3
            and parts[0] == name
            and _VERSION.fullmatch(parts[1])
            and file_name in (None, "/".join(parts[2:]))
        ):
            found.add(int(parts[1]))
    return found


def closest_first(word: str, known: list[str], cutoff: float = 0.5) -> tuple[list[str], list[str]]:
    """For a name not found: the known names close to ``word`` (difflib), and every known name with those first."""
    close = difflib.get_close_matches(word, known, n=3, cutoff=cutoff)
    return close, close + [name for name in known if name not in close]
