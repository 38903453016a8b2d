"""Training processes that never outlive their run, and a launcher that notices when one stops answering.

Three mechanisms, shared by the launcher (tasks/launch/torchrun_launcher.py) and the torchrun worker (no Prefect, no torch here):

- ``die_with_parent``: Linux's parent-death signal. torchrun starts each worker in a session of its own, so
  killing torchrun's process group (or SIGKILL of the flow process) would otherwise leave the workers training.
- ``Heartbeat``: every rank writes ``logs/heartbeat_<rank>.json`` from a thread every few seconds, with a beat
  counter and the batch it is at. A stopped or frozen process stops beating; a process stuck in a collective
  beats but does not move on. ``HangWatch`` (launcher side) tells the two apart and names the rank.
- ``output_lock``: the workers hold a shared lock on ``logs/workers.lock`` while they run; a new attempt takes it
  exclusively before it starts, so it never trains into a folder that an earlier attempt's processes still write.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HEARTBEAT_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1


def heartbeat_path(log_dir: Path, rank: int) -> Path:
    return log_dir / f"heartbeat_{rank}.json"


def lock_path(log_dir: Path) -> Path:
    return log_dir / "workers.lock"


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux; elsewhere a no-op).

    Usable as ``Popen(preexec_fn=...)``: it then applies to the child before it runs its program."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), sig)


@dataclass
class Heartbeat:
    """A thread that writes this process's liveness and progress to ``heartbeat_<rank>.json``."""

    log_dir: Path
    rank: int
    interval: float = HEARTBEAT_SECONDS
    epoch: int = 0
    step: int = 0
    phase: str = "starting"
    _beat: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Heartbeat:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._write()
        threading.Thread(target=self._run, name="heartbeat", daemon=True).start()
        return self

    def progress(self, phase: str, epoch: int, step: int = 0) -> None:
        """Record progress; plain attribute stores, cheap enough for every batch."""
        self.phase, self.epoch, self.step = phase, epoch, step

    def stop(self, phase: str = "done") -> None:
        self.phase = phase
        self._stop.set()
        self._write()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._write()

    def _write(self) -> None:
        self._beat += 1
        record = {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "beat": self._beat,
            "phase": self.phase,
            "epoch": self.epoch,
            "step": self.step,
        }
        path = heartbeat_path(self.log_dir, self.rank)
        # No fsync: a heartbeat lost in a crash is worth nothing anyway; os.replace keeps readers off half files.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)


def read_heartbeats(log_dir: Path) -> dict[int, dict]:
    beats = {}
    for path in log_dir.glob("heartbeat_*.json"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            beats[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue  # being replaced right now: read it on the next poll
    return beats


class TrainingHang(Exception):
    """Raised by HangWatch.check: what stopped, in words (the launcher turns it into TrainingHungError)."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


def _where(record: dict) -> str:
    return f"rank {record['rank']} (pid {record['pid']} on {record['host']}, epoch {record['epoch'] + 1} batch {record['step']})"


@dataclass
class HangWatch:
    """Launcher side: feeds on read_heartbeats() every poll, raises TrainingHang when

    - a rank has not beaten for ``silent_seconds`` (stopped, frozen, or holding the interpreter), or
    - no rank has moved to another batch, phase or epoch for ``stall_seconds`` (all stuck, e.g. in a collective).
    Changes are timed by this process's clock, so clocks of other machines do not matter."""

    silent_seconds: float
    stall_seconds: float
    _beats: dict[int, tuple[int, float]] = field(default_factory=dict)
    _progress: dict[int, tuple[tuple, float]] = field(default_factory=dict)
    _earlier: dict[int, tuple[int, int]] = field(default_factory=dict)

    def ignore(self, beats: dict[int, dict]) -> None:
        """Heartbeats left by an earlier attempt: not watched until a process of this attempt rewrites them."""
        self._earlier = {rank: (record["pid"], record["beat"]) for rank, record in beats.items()}

    def check(self, beats: dict[int, dict], now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        beats = {rank: b for rank, b in beats.items() if self._earlier.get(rank) != (b["pid"], b["beat"])}
        for rank, record in beats.items():
            if self._beats.get(rank, (None,))[0] != record["beat"]:
                self._beats[rank] = (record["beat"], now)
            position = (record["phase"], record["epoch"], record["step"], record["pid"])
            if self._progress.get(rank, (None,))[0] != position:
                self._progress[rank] = (position, now)
        running = {rank: record for rank, record in beats.items() if record["phase"] not in ("done", "failed")}
        silent = sorted(rank for rank in running if now - self._beats[rank][1] > self.silent_seconds)
        if silent:
            raise TrainingHang(
                "; ".join(_where(running[rank]) for rank in silent)
                + f" stopped responding: no heartbeat for {now - self._beats[silent[0]][1]:.0f} s "
                f"(hang_timeout_s={self.silent_seconds:g})",
                silent,
            )
        if running and all(now - self._progress[rank][1] > self.stall_seconds for rank in running):
            # The rank that moved last-but-longest-ago is the one the others wait for.
            stuck = min(running, key=lambda rank: self._progress[rank][1])
            raise TrainingHang(
                f"no progress for {now - self._progress[stuck][1]:.0f} s (stall_timeout_s={self.stall_seconds:g}): "
                + "; ".join(_where(record) for record in running.values())
                + f"; rank {stuck} stopped moving first",
                [stuck],
            )


def local_pids(beats: dict[int, dict]) -> list[int]:
    """The worker processes the heartbeats name on this machine."""
    host = socket.gethostname()
    return [record["pid"] for record in beats.values() if record["host"] == host]


@contextlib.contextmanager
def output_lock(log_dir: Path, *, shared: bool, wait_seconds: float = 0.0) -> Iterator[None]:
    """Hold ``logs/workers.lock``: shared by the workers of one attempt, exclusive for a launcher checking that no
    earlier attempt's workers are left. Raises BlockingIOError when not granted within ``wait_seconds``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path(log_dir), "a+b")
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
        yield
    finally:
        handle.close()


def failure_path(log_dir: Path, rank: int) -> Path:
    return log_dir / f"failure_{rank}.json"


def write_failure(log_dir: Path, rank: int, error: BaseException) -> None:
    """What a rank raised, for the launcher: the type travels across the process boundary by name."""
    record = {"type": type(error).__name__, "module": type(error).__module__, "message": str(error)}
    failure_path(log_dir, rank).write_text(json.dumps(record), encoding="utf-8")


def read_failure(log_dir: Path, rank: int) -> dict | None:
    try:
        return json.loads(failure_path(log_dir, rank).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> None:
    """``python -m tasks.training.lifeline PROGRAM ARGS…``: run PROGRAM so that it gets SIGTERM when our parent exits.

    The launcher starts torchrun through this rather than with ``preexec_fn``, which is unsafe in a process
    with threads (a Prefect flow); the signal request survives ``exec``."""
    if not argv or argv[0].startswith("-"):
        raise SystemExit(
            "usage: python -m tasks.training.lifeline PROGRAM [ARG ...]: runs PROGRAM, which is sent SIGTERM when "
            "the process that started it exits (the training launcher starts torchrun so)"
        )
    die_with_parent(signal.SIGTERM)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
