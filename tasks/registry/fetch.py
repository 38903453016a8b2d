"""Fetching a registered version as a local ModelDirectory, its files checked against their registered sha256.

On a local registry the version folder itself is used (refused when it differs); from S3 a version is
downloaded once into ``<cache>/<name>/<version>`` (downloaded again when the cached copy differs).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.registry_layout import REGISTRATION_FILE, Registration, reference_or_folder, version_key
from tasks.errors import InvalidModelDirectoryError, ModelIntegrityError
from tasks.registry.backends import LocalBackend, RegistryBackend
from tasks.registry.core import Registry, backend_of, resolve
from tasks.registry.integrity import memo_path, mismatched_files, remember
from tasks.storage.local_files import sha256_file

logger = logging.getLogger(__name__)


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
    backend = backend_of(registry)
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
    reference = reference_or_folder(model)
    if reference is None:
        return ModelDirectory(model)
    return fetch_model(registry, str(reference), cache_dir)


def fetch_to(registry: Registry, reference: str, destination: str | os.PathLike[str]) -> Registration:
    """Copy a version into the new folder ``destination`` (created; refused if it holds anything), every file
    checked against the sha256 recorded at registration before the folder appears; with its registration.json."""
    backend = backend_of(registry)
    registration = resolve(backend, reference)
    target = Path(destination).expanduser().resolve()
    if target.exists():
        if not target.is_dir() or any(target.iterdir()):
            raise InvalidModelDirectoryError(f"{target} already exists and is not an empty folder: give a new folder")
        target.rmdir()  # _download renames the checked copy into place
    with tempfile.TemporaryDirectory(dir=target.parent if target.parent.is_dir() else None) as scratch:
        _download(backend, registration, target, Path(scratch) / "sha256.json")
    return registration
