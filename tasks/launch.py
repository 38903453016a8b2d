"""Launch the torchrun worker (tasks/training/worker.py) and watch it: ``launch_training``, the one way to train.

The command is built by a pure function, run without a shell, its output streamed line by line, its metrics
file polled for progress and its heartbeats and time limit watched. A non-zero exit becomes a typed error
(TrainingFailedError and kin) that names the failing rank and carries that rank's log tail.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tasks
from tasks import errors
from tasks.allocator import allocator_environment
from tasks.errors import (
    OutputInUseError,
    PipelineInputError,
    TrainingDivergedError,
    TrainingFailedError,
    TrainingHungError,
    TrainingTimeoutError,
)
from tasks.lifeline import (
    HangWatch,
    TrainingHang,
    local_pids,
    output_lock,
    read_failure,
    read_heartbeats,
)
from tasks.model_directory import (
    DIVERGED_MARKER,
    FAILURE_MARKER,
    LOGS_DIR,
    METRICS_FILE,
    ModelDirectory,
    TrainingMetrics,
    driver_log_path,
)
from tasks.training.config import TrainingParams, training_flags
from tasks.workdir import TrainingFolders, stage_training

WORKER_MODULE = "tasks.training.worker"
LOG_TAIL_LINES = 40
_FAILED_RANK = re.compile(re.escape(FAILURE_MARKER) + r" (\d+)")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def build_torchrun_command(
    folders: TrainingFolders,
    params: TrainingParams,
    *,
    run_id: str = "image-classifier",
    is_host: bool | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The ``python -m torch.distributed.run ... -m tasks.training.worker ...`` argument list.

    With ``nodes > 1``, ``is_host`` says whether this node serves the rendezvous (the first node of a launch
    through the work pool); ``None`` leaves it to torchrun, which serves it when the endpoint names this machine."""
    # fmt: off
    command = [python, "-m", "torch.distributed.run", "--nnodes", str(params.nodes),
               "--nproc-per-node", str(params.processes_per_node), "--max-restarts", str(params.max_restarts)]
    if params.max_nodes == 1:
        # A private rendezvous on a free port: runs on one host never collide.
        command.append("--standalone")
    elif params.rendezvous_endpoint:
        conf = f"join_timeout={params.join_timeout_s:g}" + ("" if is_host is None else f",is_host={int(is_host)}")
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", params.rendezvous_endpoint,
                    "--rdzv-id", params.rendezvous_id or run_id, "--rdzv-conf", conf]
    else:
        raise PipelineInputError(
            f"nodes={params.nodes} needs rendezvous_endpoint (host:port reachable from every node, e.g. the first "
            "node's address and port 29400) when torchrun is launched directly; the train task finds one itself"
        )
    return command + [
        "-m", WORKER_MODULE,
        "--train", str(folders.train_dir), "--validation", str(folders.validation_dir),
        "--model-spec", str(folders.model_spec_dir), "--output", str(folders.output_dir),
        *training_flags(params),
    ]
    # fmt: on


def worker_environment(params: TrainingParams, base: dict[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment, plus what the worker needs: the project importable, unbuffered output,
    the CPU threads shared out between processes instead of torchrun's default of one each, and glibc's
    allocator told to keep freed memory for the next batch (tasks/allocator.py: ~1.3x training steps/s on CPU)."""
    env = dict(os.environ if base is None else base)
    project_root = str(Path(tasks.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (project_root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // params.processes_per_node)))
    if params.min_nodes < params.max_nodes:
        # Elastic: with the rendezvous store shared with the workers (torch's default), a node joining a running
        # job waits for an address the first node never writes again, and both launchers fail after 60 s
        # (DistStoreError). Unshared, the workers' rank 0 publishes a store of its own in every round.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return allocator_environment(env)


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


@dataclass(frozen=True)
class WatchLimits:
    """How long a training may run, and how long a process may stay silent or stuck (tasks/lifeline.py)."""

    timeout_s: float | None = None
    hang_timeout_s: float = 120.0
    stall_timeout_s: float = 600.0
    # A retry starts seconds after a failure: the old attempt's workers die with their launcher by then.
    output_lock_wait_s: float = 60.0
    # With nodes > 1 every node's launcher shares the output folder: none of them may claim it alone.
    claim_output: bool = True

    @classmethod
    def of(cls, params: TrainingParams) -> WatchLimits:
        return cls(
            timeout_s=params.timeout_minutes * 60 if params.timeout_minutes else None,
            hang_timeout_s=params.hang_timeout_s,
            stall_timeout_s=params.stall_timeout_s,
            claim_output=params.max_nodes == 1,
        )


def claim_output(log_dir: Path, wait_seconds: float) -> None:
    """Make sure no process of an earlier attempt still writes here, then forget its heartbeats and failures."""
    try:
        with output_lock(log_dir, shared=False, wait_seconds=wait_seconds):
            for stale in [*log_dir.glob("heartbeat_*.json"), *log_dir.glob("failure_*.json")]:
                stale.unlink(missing_ok=True)
    except BlockingIOError:
        holders = ", ".join(
            f"rank {rank} pid {b['pid']} on {b['host']}" for rank, b in sorted(read_heartbeats(log_dir).items())
        )
        raise OutputInUseError(
            f"training processes of an earlier attempt still write {log_dir.parent} ({holders or 'pids unknown'}) "
            f"after {wait_seconds:g} s: stop them, or train into another output folder"
        ) from None


def stop_training(process: subprocess.Popen, log_dir: Path, grace_seconds: float = 10.0) -> None:
    """torchrun first, politely (it stops its workers); then SIGKILL for what is left, stopped processes included."""
    workers = local_pids(read_heartbeats(log_dir))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def input_error_of(failure: dict | None) -> type[PipelineInputError] | None:
    """The worker raised a mistake in the input (by type name, across the process boundary): retrying cannot help."""
    found = getattr(errors, failure["type"], None) if failure and failure.get("module") == errors.__name__ else None
    if isinstance(found, type) and issubclass(found, PipelineInputError) and not issubclass(found, TrainingFailedError):
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


def run_training(
    command: list[str],
    output_dir: str | os.PathLike[str],
    env: dict[str, str],
    *,
    log: Callable[[int, str], None] = print_line,
    on_metrics: Callable[[TrainingMetrics], None] = lambda metrics: None,
    limits: WatchLimits = WatchLimits(),
    poll_seconds: float = 1.0,
    on_poll: Callable[[], None] = lambda: None,
) -> ModelDirectory:
    """Run the torchrun command to completion; stream its lines to ``log`` (level, line), new epochs to
    ``on_metrics``, and call ``on_poll`` on every look. A silent or stuck rank, or a run past its time, stops
    every process and raises."""
    output_dir = Path(output_dir)
    log_dir = output_dir / LOGS_DIR
    if limits.claim_output:
        claim_output(log_dir, limits.output_lock_wait_s)
    watch = HangWatch(silent_seconds=limits.hang_timeout_s, stall_seconds=limits.stall_timeout_s)
    watch.ignore(read_heartbeats(log_dir))
    # Enough of torchrun's output to hold its closing failure report.
    output: collections.deque[str] = collections.deque(maxlen=10 * LOG_TAIL_LINES)
    # Through tasks.lifeline: torchrun gets SIGTERM (and stops its workers) if this process dies, even by SIGKILL.
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.lifeline", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env=env,
        start_new_session=True,
    )

    def pump() -> None:
        level_of = LineLevels()
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            log(level_of(line), line.rstrip("\n"))

    reader = threading.Thread(target=pump, name="torchrun-output", daemon=True)
    reader.start()
    started = time.monotonic()
    new_epochs = NewEpochs(lambda: read_metrics(output_dir), on_metrics)
    try:
        while True:
            finished = process.poll() is not None
            on_poll()
            new_epochs.poll()
            if finished:
                break
            try:
                watch.check(read_heartbeats(log_dir))
            except TrainingHang as hang:
                stop_training(process, log_dir)
                raise TrainingHungError(
                    f"training hung: {hang}; every training process was stopped",
                    returncode=process.returncode,
                    rank=hang.ranks[0],
                    log_tail=log_tail(driver_log_path(output_dir, hang.ranks[0])),
                ) from None
            if limits.timeout_s is not None and time.monotonic() - started > limits.timeout_s:
                stop_training(process, log_dir)
                raise TrainingTimeoutError(
                    f"training ran past its limit of {limits.timeout_s / 60:g} minutes (timeout_minutes) after "
                    f"{max(new_epochs.seen, 0)} epochs; every training process was stopped, a retry resumes from the checkpoint",
                    returncode=process.returncode,
                    rank=None,
                    log_tail="\n".join(list(output)[-LOG_TAIL_LINES:]),
                )
            try:
                process.wait(timeout=poll_seconds)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if process.poll() is None:
            # Cancelled or interrupted: take torchrun and all its workers down with us.
            stop_training(process, log_dir)
        reader.join(timeout=10)
    if process.returncode != 0:
        raise training_failure(output_dir, process.returncode, list(output))
    return ModelDirectory(output_dir)


def launch_training(
    train_dir: str | os.PathLike[str],
    validation_dir: str | os.PathLike[str],
    model_spec_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    params: TrainingParams,
    *,
    run_id: str = "image-classifier",
    is_host: bool | None = None,
    log: Callable[[int, str], None] = print_line,
    on_metrics: Callable[[TrainingMetrics], None] = lambda metrics: None,
    poll_seconds: float = 1.0,
    limits: WatchLimits | None = None,
) -> ModelDirectory:
    """Train: the torchrun command, the workers' environment, the run watched within ``params``' limits (or
    ``limits``).

    Everything that starts training (the train task, each node of a multi-node training, tests, benchmarks)
    comes through here. Any location may be ``s3://``: the inputs are fetched to this host's cache and the
    output kept in step with its S3 folder while training runs (tasks/workdir.py)."""
    staged = stage_training(str(train_dir), str(validation_dir), str(model_spec_dir), str(output_dir))
    command = build_torchrun_command(staged, params, run_id=run_id, is_host=is_host)
    # One short line at INFO; the whole command (tens of flags and paths) at DEBUG, for whoever needs to rerun it.
    nodes = f"{params.nodes} nodes x " if str(params.nodes) != "1" else ""
    log(logging.INFO, f"launching torchrun: {nodes}{params.processes_per_node} process(es), {params.epochs} epochs")
    log(logging.DEBUG, f"torchrun command: {shlex.join(command)}")
    model_dir = run_training(
        command,
        staged.output_dir,
        worker_environment(params),
        log=log,
        on_metrics=on_metrics,
        limits=limits or WatchLimits.of(params),
        poll_seconds=poll_seconds,
        on_poll=staged.sync,
    )
    staged.finish()
    return model_dir
