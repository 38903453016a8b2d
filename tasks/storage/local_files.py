"""Small file helpers shared by every stage (and the torchrun worker): no Prefect here."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import IO

from tasks.errors import OutputStorageError

_CHUNK = 1 << 20


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", *, exclusive: bool = False) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success ``os.replace`` it into place.

    Readers (and a process restarted after a crash) see the old file or the new one, never half of one.
    With ``exclusive`` the finished file is hard-linked into place instead: an exclusive create that raises
    FileExistsError when ``path`` exists (open(O_EXCL) then write() would show a reader half a file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def staged_directory(output: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh folder beside ``output`` to fill; on success it replaces ``output`` whole, on failure it
    is removed, so ``output`` is only ever the old complete folder or the new complete one."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.staging-"))
    try:
        yield staging
        if output.exists():
            shutil.rmtree(output)
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def copy_atomic(source: str | os.PathLike[str], destination: str | os.PathLike[str]) -> Path:
    """``source`` copied to ``destination`` (its folder made), which appears whole or not at all."""
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb") as reader, atomic_write(destination, "wb") as writer:
        shutil.copyfileobj(reader, writer)
    return destination


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_write(path) as handle:
        handle.write(text)


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# Errors of the storage itself (full, over quota, read-only, failing, forbidden): a retry cannot help.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM})


def megabytes(size: int) -> str:
    return f"{size / 2**20:,.1f} MB"


def require_space(where: Path, needed: int, what: str, why: str, instead: str) -> None:
    """Refuse before any work when the filesystem of ``where`` has less than ``needed`` bytes free, with the
    arithmetic (``why``: what the figure counts; ``instead``: what else the user may choose)."""
    free = shutil.disk_usage(where).free
    if needed > free:
        raise OutputStorageError(
            f"not enough space for {what} at {where}: about {megabytes(needed)} needed ({why}), {megabytes(free)} "
            f"free; free space there or choose another {instead}"
        )


def storage_fault(what: str, error: OSError, needed: int, where: Path | None = None) -> OutputStorageError | None:
    """``error`` writing ``what`` as one OutputStorageError naming the free space (of ``where``, else of the
    error's file) and what was needed (None when it is not a fault of the storage)."""
    if error.errno not in STORAGE_ERRNOS:
        return None
    where = where or (Path(error.filename) if error.filename else Path.cwd())
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    return OutputStorageError(
        f"cannot write {what}: [Errno {error.errno}] {error.strerror}; about {megabytes(needed)} needed, "
        f"{megabytes(free)} free there: fix the storage and run again"
    )


def storage_cause(error: BaseException | None) -> OSError | None:
    """The OSError of a full or failing disk behind ``error``: itself, or one it was raised from or while handling
    (torch.save reports one as a RuntimeError "[enforce fail at inline_container.cc] unexpected pos", the OSError
    only in its context)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return error
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def storage_faults(what: str, needed: int | Callable[[], int], where: Path | None = None) -> Iterator[None]:
    """Around writing ``what``: a fault of the storage (behind whatever error reports it) becomes the one
    OutputStorageError of ``storage_fault``; any other error goes on as it is. ``needed``: the bytes, or what
    works them out once a fault happens (for what is written as it is made)."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        cause = storage_cause(error)
        if cause is None:
            raise
        raise storage_fault(what, cause, needed() if callable(needed) else needed, where) from error


def in_order(pool: Executor, function: Callable, arguments: Iterable[tuple], window: int = 1024) -> Iterator:
    """``function(*a)`` for each ``a`` of ``arguments`` on ``pool``, the results in order, with at most ``window``
    calls submitted ahead of the result being read: memory does not grow with the number of calls (``pool.map``
    submits them all at once)."""
    pending: deque = deque()
    for each in arguments:
        pending.append(pool.submit(function, *each))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def link_or_copy(source: Path, destination: Path) -> None:
    """``destination`` the same file as ``source``: a hard link (no bytes copied, the source untouched), or a copy
    on another filesystem or one without hard links; its folder made."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(source, destination)
