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
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tasks
from tasks.allocator import allocator_environment
from tasks.contracts.model_directory import (
    LOGS_DIR,
    ModelDirectory,
    TrainingMetrics,
    driver_log_path,
)
from tasks.contracts.training_config import TrainingFolders, TrainingParams, training_flags
from tasks.errors import (
    OutputInUseError,
    PipelineInputError,
    TrainingHungError,
    TrainingTimeoutError,
)
from tasks.launch.interrupts import StopOnSignal
from tasks.launch.torchrun_output import (
    LOG_TAIL_LINES,
    LineLevels,
    NewEpochs,
    log_tail,
    print_line,
    read_metrics,
    training_failure,
)
from tasks.training.lifeline import (
    HangWatch,
    TrainingHang,
    local_pids,
    output_lock,
    read_heartbeats,
)
from tasks.work_dir.training_output import StagedTraining, stage_training

WORKER_MODULE = "tasks.training.worker"
# After Ctrl-C or SIGTERM, how long torchrun has to stop its ranks before they are killed: a person waits for it, and
# every process is to be gone within 15 s however loaded the host (with 10 s a loaded 2-core CI host took longer).
SIGNAL_GRACE_S = 5.0


def build_torchrun_command(
    folders: TrainingFolders | StagedTraining,
    params: TrainingParams,
    *,
    run_id: str = "image-classifier",
    is_host: bool | None = None,
    python: str = sys.executable,
    log_dir: str | None = None,
) -> list[str]:
    """The ``python -m torch.distributed.run ... -m tasks.training.worker ...`` argument list.

    With ``nodes > 1``, ``is_host`` says whether this node serves the rendezvous (the first node of a launch
    through the work pool); ``None`` leaves it to torchrun, which serves it when the endpoint names this machine.
    ``log_dir``: where torchrun makes its per-attempt folders (without it, a new ``torchelastic_*`` folder in the
    system's temporary folder that it never removes)."""
    # fmt: off
    command = [python, "-m", "torch.distributed.run", "--nnodes", str(params.nodes),
               "--nproc-per-node", str(params.processes_per_node), "--max-restarts", str(params.max_restarts)]
    if log_dir is not None:
        command += ["--log-dir", log_dir]
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
    allocator told to keep freed memory for the next batch (tasks/allocator.py)."""
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


@dataclass(frozen=True)
class WatchLimits:
    """How long a training may run, and how long a process may stay silent or stuck (tasks/training/lifeline.py)."""

    timeout_s: float | None = None
    hang_timeout_s: float = 120.0
    stall_timeout_s: float = 600.0
    # A retry starts seconds after a failure: the old attempt's workers die with their launcher by then.
    output_lock_wait_s: float = 60.0
    # With nodes > 1 every node's launcher shares the output folder: none of them may claim it alone.
    claim_output: bool = True

    @classmethod
    def for_params(cls, params: TrainingParams) -> WatchLimits:
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
    every process and raises; so does SIGINT or SIGTERM, whatever the main thread is doing, raised again as the
    handler there before would have it (KeyboardInterrupt for Ctrl-C)."""
    output_dir = Path(output_dir)
    log_dir = output_dir / LOGS_DIR
    if limits.claim_output:
        claim_output(log_dir, limits.output_lock_wait_s)
    watch = HangWatch(silent_seconds=limits.hang_timeout_s, stall_seconds=limits.stall_timeout_s)
    watch.ignore(read_heartbeats(log_dir))
    # Enough of torchrun's output to hold its closing failure report.
    output: collections.deque[str] = collections.deque(maxlen=10 * LOG_TAIL_LINES)
    # Through tasks.training.lifeline: torchrun gets SIGTERM (and stops its workers) if this process dies, even by SIGKILL.
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.training.lifeline", *command],
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
        # Ctrl-C or SIGTERM: every process stopped at once, raised again on leaving (tasks/launch/interrupts.py).
        with StopOnSignal(lambda: stop_training(process, log_dir, SIGNAL_GRACE_S)) as signalled:
            while not signalled.received:
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
    folders: TrainingFolders,
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
    output kept in step with its S3 folder while training runs (tasks/work_dir/training_output.py)."""
    staged = stage_training(folders)
    # torchrun's attempt folders hold nothing here (the ranks' output comes through its stdout): removed after.
    with tempfile.TemporaryDirectory(prefix="torchrun-", ignore_cleanup_errors=True) as torchrun_logs:
        command = build_torchrun_command(staged, params, run_id=run_id, is_host=is_host, log_dir=torchrun_logs)
        # One short line at INFO; the whole command (tens of flags and paths) at DEBUG, for whoever reruns it.
        nodes = f"{params.nodes} nodes x " if str(params.nodes) != "1" else ""
        log(logging.INFO, f"launching torchrun: {nodes}{params.processes_per_node} process(es), {params.epochs} epochs")
        log(logging.DEBUG, f"torchrun command: {shlex.join(command)}")
        model_dir = run_training(
            command,
            staged.output_dir,
            worker_environment(params),
            log=log,
            on_metrics=on_metrics,
            limits=limits or WatchLimits.for_params(params),
            poll_seconds=poll_seconds,
            on_poll=staged.sync,
        )
    staged.finish()
    return model_dir
