"""Where registry keys live: one small interface, a local-disk backend here and an S3 one in ``s3.py``.

Keys are ``/``-separated paths below the registry root (see ``tasks/contracts/registry_layout.py``). Two operations make concurrent
writers safe: ``create_exclusive`` (of several writers of one key, exactly one wins) and ``replace_if``, a
compare-and-swap on a key read with ``read_tagged`` (an alias moves only from the state its mover judged).
``swap`` is the one read-judge-write loop built on them, used for every record people change (aliases, a
version's status).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from tasks.storage.local_files import atomic_write

SWAP_ATTEMPTS = 20


class RegistryBackend(ABC):
    location: str

    @abstractmethod
    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create ``key`` holding ``data`` unless it exists; False when it already did."""

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Create or replace ``key``; readers see the old content or the new, never part of it."""

    @abstractmethod
    def read(self, key: str) -> bytes | None:
        """The content of ``key``, or None when there is no such key."""

    @abstractmethod
    def read_tagged(self, key: str) -> tuple[bytes, str] | None:
        """The content of ``key`` and a tag that changes whenever it does, or None when there is no such key."""

    @abstractmethod
    def replace_if(self, key: str, data: bytes, tag: str | None) -> bool:
        """Write ``data`` to ``key`` only if it still has ``tag`` (None: only if it does not exist);
        False when another writer came first."""

    @abstractmethod
    def upload(self, key: str, path: Path) -> None:
        """Store the local file ``path`` as ``key``."""

    @abstractmethod
    def download(self, key: str, path: Path) -> None:
        """Write ``key`` to the local file ``path`` (atomically)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; no error when it is already gone."""

    @abstractmethod
    def list_keys(self, prefix: str) -> list[str]:
        """Every key below the folder ``prefix`` ("" for the whole registry)."""


class LocalBackend(RegistryBackend):
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if any(part in ("", ".", "..") or "\\" in part for part in parts):
            raise ValueError(f"registry key {key!r} would leave {self.location}")
        return self.root.joinpath(*parts)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        try:
            with atomic_write(self._path(key), "wb", exclusive=True) as handle:
                handle.write(data)
            return True
        except FileExistsError:
            return False

    def write(self, key: str, data: bytes) -> None:
        with atomic_write(self._path(key), "wb") as handle:
            handle.write(data)

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def read_tagged(self, key: str) -> tuple[bytes, str] | None:
        data = self.read(key)
        return None if data is None else (data, hashlib.sha256(data).hexdigest())

    def replace_if(self, key: str, data: bytes, tag: str | None) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # flock is released by the kernel when its holder dies, so a crashed writer leaves no stale lock.
        with open(path.parent / f".{path.name}.lock", "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.read_tagged(key)
            if (current[1] if current else None) != tag:
                return False
            self.write(key, data)
            return True

    def upload(self, key: str, path: Path) -> None:
        with open(path, "rb") as source, atomic_write(self._path(key), "wb") as target:
            shutil.copyfileobj(source, target)

    def download(self, key: str, path: Path) -> None:
        with open(self._path(key), "rb") as source, atomic_write(path, "wb") as target:
            shutil.copyfileobj(source, target)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list_keys(self, prefix: str) -> list[str]:
        folder = self._path(prefix) if prefix else self.root
        if not folder.is_dir():
            return []
        # Names starting with "." are temporary files of writes in progress, not keys.
        return sorted(
            p.relative_to(self.root).as_posix() for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
        )


def swap(backend: RegistryBackend, key: str, change: Callable[[bytes | None], bytes | None]) -> bytes | None:
    """Compare-and-swap ``key`` to ``change(current content)`` (None: no such key); ``change`` returning None
    leaves it alone. When another writer came first, read and judge again (``change`` is called again), up to
    ``SWAP_ATTEMPTS`` times. Returns what was written, or None."""
    for attempt in range(SWAP_ATTEMPTS):
        tagged = backend.read_tagged(key)
        data = change(tagged[0] if tagged else None)
        if data is None:
            return None
        # A lost answer to our own successful write reads back as our bytes.
        if backend.replace_if(key, data, tagged[1] if tagged else None) or backend.read(key) == data:
            return data
        time.sleep(random.uniform(0, min(1.0, 0.02 * 2**attempt)))
    raise TimeoutError(f"{backend.location}/{key} kept changing under {SWAP_ATTEMPTS} attempts to change it")
