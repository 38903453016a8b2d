"""What a launched training leaves and prints, read by its launcher (tasks/launch/torchrun_launcher.py): the metrics file and its new
epochs, the level of each line torchrun and the workers print, and the failure they tell of: the rank that failed
first, its log's tail, and the typed error a person reads first (an input mistake raised in a worker keeps its
type across the process boundary)."""

from __future__ import annotations

import logging
import re
import signal
from collections.abc import Callable
from pathlib import Path

import tasks.errors
from tasks.contracts.model_directory import (
    DIVERGED_MARKER,
    FAILURE_MARKER,
    LOGS_DIR,
    METRICS_FILE,
    TrainingMetrics,
    driver_log_path,
)
from tasks.errors import PipelineInputError, TrainingDivergedError, TrainingFailedError, UnreadableImageError
from tasks.training.lifeline import read_failure

LOG_TAIL_LINES = 40
_FAILED_RANK = re.compile(re.escape(FAILURE_MARKER) + r" (\d+)")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def failure_origin(output_dir: Path, launcher_output: str) -> tuple[int | None, str]:
    """The rank that failed first, and how: torchrun's "Root Cause" report when it printed one (it knows
    about ranks killed by a signal, which log nothing), else the first rank whose log records a failure."""
    report = _ROOT_CAUSE.search(launcher_output)
    if report:
        code = int(report[2])
        killed_by = f" ({signal.Signals(-code).name})" if -code in {s.value for s in signal.Signals} else ""
        return int(report[1]), f"exit code {code}{killed_by}"
    for log in sorted((output_dir / LOGS_DIR).glob("driver_log_*.txt")):
        found = _FAILED_RANK.findall(log.read_text(encoding="utf-8", errors="replace"))
        if found:
            return int(found[-1]), "raised an exception"
    return None, ""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def read_metrics(output_dir: Path) -> TrainingMetrics | None:
    path = output_dir / METRICS_FILE
    try:
        return TrainingMetrics.model_validate_json(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


class NewEpochs:
    """Hands ``on_metrics`` the metrics ``read`` returns each time they hold another number of epochs."""

    def __init__(
        self, read: Callable[[], TrainingMetrics | None], on_metrics: Callable[[TrainingMetrics], None]
    ) -> None:
        self.read, self.on_metrics, self.seen = read, on_metrics, -1

    def poll(self) -> None:
        metrics = self.read()
        if metrics is not None and len(metrics.epochs) != self.seen:
            self.seen = len(metrics.epochs)
            self.on_metrics(metrics)


_WORKER_LEVEL = re.compile(r"^\[rank \d+\] (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
_TORCH_LEVEL = re.compile(r"^([DIWEF])\d{4} \d\d:\d\d:\d\d")
_GLOG_LEVELS = {"D": logging.DEBUG, "I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR, "F": logging.CRITICAL}


class LineLevels:
    """The logging level of each line torchrun prints: the workers' ``[rank N] LEVEL`` and torch's ``W1122 …``
    prefixes; a line without one (a traceback's frames) continues the level of the line before it.

    torchrun's own closing traceback (ChildFailedError and its table) repeats a failure the ranks have already
    logged and the launcher raises: it goes at INFO, so each failure is an error once."""

    def __init__(self) -> None:
        self.level = logging.INFO
        self.from_torchrun = False

    def __call__(self, line: str) -> int:
        worker, torch_line = _WORKER_LEVEL.match(line), _TORCH_LEVEL.match(line)
        if worker:
            self.level, self.from_torchrun = logging.getLevelName(worker[1]), False
        elif torch_line:
            self.level, self.from_torchrun = _GLOG_LEVELS[torch_line[1]], True
        elif self.from_torchrun and line.startswith("Traceback (most recent call last)"):
            self.level = logging.INFO
        return self.level


def print_line(level: int, line: str) -> None:
    print(line)


def input_error_of(failure: dict | None) -> type[PipelineInputError] | None:
    """The worker raised a mistake in the input (by type name, across the process boundary): retrying cannot help."""
    found = (
        getattr(tasks.errors, failure["type"], None)
        if failure and failure.get("module") == tasks.errors.__name__
        else None
    )
    # An image unreadable in training was read whole at conversion: damaged since, a runtime failure (retried).
    runtime = (TrainingFailedError, UnreadableImageError)
    if isinstance(found, type) and issubclass(found, PipelineInputError) and not issubclass(found, runtime):
        return found
    return None


def training_failure(output_dir: Path, returncode: int, launcher_output: list[str]) -> Exception:
    """The exception for a torchrun that exited non-zero, its first line the one a person should read."""
    rank, how = failure_origin(output_dir, "\n".join(launcher_output))
    rank_log = driver_log_path(output_dir, rank) if rank is not None else None
    failure = read_failure(output_dir / LOGS_DIR, rank) if rank is not None else None
    where = f"rank {rank} first, {how}; its full log is {rank_log}" if rank is not None else "no rank logged a failure"
    input_error = input_error_of(failure)
    if input_error is not None:
        return input_error(f"{failure['message']}\n(raised by training rank {rank}; its full log is {rank_log})")
    tail = (log_tail(rank_log) if rank_log else "") or "\n".join(launcher_output[-LOG_TAIL_LINES:])
    options = dict(returncode=returncode, rank=rank, log_tail=tail)
    message = failure["message"] if failure else ""
    if DIVERGED_MARKER in message or DIVERGED_MARKER in tail:
        headline = message or next(line for line in tail.splitlines() if DIVERGED_MARKER in line)
        return TrainingDivergedError(f"{headline[headline.index(DIVERGED_MARKER) :]}\n({where})", **options)
    headline = f"training failed on {where}" + (f": {failure['type']}: {message}" if failure else "")
    return TrainingFailedError(f"{headline}\n(torchrun exit code {returncode})", **options)


def watchable(log: Callable[[int, str], None]) -> Callable[[int, str], None]:
    """``log`` for torchrun's lines, each made safe for `prefect deployment run --watch`, which prints log messages
    as rich markup: a "[/…]" in a line (PyTorch's gloo errors begin with their source file so) is a closing tag
    without an opening one, and the watch stopped on it (MarkupError) while the run went on. Escaped as rich
    escapes it; the ranks' own log files keep the line as it was."""
    return lambda level, line: log(level, line.replace("[/", "\\[/"))
