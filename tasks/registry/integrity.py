"""Checking a model folder against the sha256 its registration recorded, without re-hashing unchanged files.

A memo file keeps, per file, the sha256 last computed together with the file's size, mtime, ctime and inode:
while those are unchanged the recorded hash is trusted, so a model fetched a hundred times is hashed once.
Any write to a file (even one restoring its mtime) changes its ctime, which only the kernel sets.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tasks.storage.local_files import sha256_file, write_text_atomic


def _stamp(path: Path) -> list[int]:
    status = path.stat()
    return [status.st_size, status.st_mtime_ns, status.st_ctime_ns, status.st_ino]


def _load_memo(memo: Path) -> dict[str, dict]:
    try:
        loaded = json.loads(memo.read_text(encoding="utf-8"))
        return loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError):
        return {}  # a missing or damaged memo only costs hashing again


def mismatched_files(folder: Path, expected: dict[str, str], memo: Path) -> dict[str, str]:
    """The files of ``expected`` (name -> sha256) below ``folder`` that are missing or differ, with what was found."""
    known, updated, wrong = _load_memo(memo), {}, {}
    for name, digest in expected.items():
        path = folder / name
        try:
            stamp = _stamp(path)
        except FileNotFoundError:
            wrong[name] = "missing"
            continue
        entry = known.get(str(path))
        actual = entry["sha256"] if isinstance(entry, dict) and entry.get("stamp") == stamp else sha256_file(path)
        updated[str(path)] = {"stamp": stamp, "sha256": actual}
        if actual != digest:
            wrong[name] = f"sha256 {actual}"
    if updated != {k: known.get(k) for k in updated}:
        try:
            write_text_atomic(memo, json.dumps({**known, **updated}, indent=1))
        except OSError:
            pass  # a read-only cache still verifies, only more slowly
    return wrong


def remember(folder: Path, hashes: dict[str, str], memo: Path) -> None:
    """Record hashes just computed for ``folder`` (a fresh download), so the next check need not recompute them."""
    known = _load_memo(memo)
    for name, digest in hashes.items():
        known[str(folder / name)] = {"stamp": _stamp(folder / name), "sha256": digest}
    write_text_atomic(memo, json.dumps(known, indent=1))


def memo_path(cache_dir: str | os.PathLike[str], name: str, version: int) -> Path:
    """Where the memo of one version lives: below the fetch cache, never inside a registry (which may be read-only)."""
    return Path(cache_dir) / ".sha256" / f"{name}.{version}.json"
