"""Train PyTorch Model: launch the torchrun worker (tasks/training/worker.py) and watch it.

The command is built by a pure function, run without a shell, its output streamed line by line,
and its metrics file polled for progress. A non-zero exit becomes a TrainingFailedError that names
the failing rank and carries that rank's log tail.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import tasks
from tasks.allocator import allocator_environment
from tasks.errors import PipelineInputError, TrainingDivergedError, TrainingFailedError
from tasks.model_directory import (
    DIVERGED_MARKER,
    FAILURE_MARKER,
    LOGS_DIR,
    METRICS_FILE,
    TRAINING_CURVES_FILE,
    ModelDirectory,
    TrainingMetrics,
    driver_log_path,
)
from tasks.training.config import TrainingParams, training_flags

WORKER_MODULE = "tasks.training.worker"
LOG_TAIL_LINES = 40
_FAILED_RANK = re.compile(re.escape(FAILURE_MARKER) + r" (\d+)")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def build_torchrun_command(
    *,
    train_dir: str | os.PathLike[str],
    validation_dir: str | os.PathLike[str],
    model_spec_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    params: TrainingParams,
    run_id: str = "image-classifier",
    python: str = sys.executable,
) -> list[str]:
    """The ``python -m torch.distributed.run ... -m tasks.training.worker ...`` argument list."""
    command = [python, "-m", "torch.distributed.run", "--nnodes", str(params.nodes),
               "--nproc-per-node", str(params.processes_per_node), "--max-restarts", str(params.max_restarts)]  # fmt: skip
    if params.nodes == 1:
        # A private rendezvous on a free port: runs on one host never collide.
        command.append("--standalone")
    elif params.rendezvous_endpoint:
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", params.rendezvous_endpoint,
                    "--rdzv-id", params.rendezvous_id or run_id]  # fmt: skip
    else:
        raise PipelineInputError(
            f"nodes={params.nodes} needs rendezvous_endpoint (host:port reachable from every node, "
            "e.g. the first node's address and port 29400)"
        )
    return command + [
        "-m", WORKER_MODULE,
        "--train", str(train_dir), "--validation", str(validation_dir),
        "--model-spec", str(model_spec_dir), "--output", str(output_dir),
        *training_flags(params),
    ]  # fmt: skip


def worker_environment(params: TrainingParams, base: dict[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment, plus what the worker needs: the project importable, unbuffered output,
    the CPU threads shared out between processes instead of torchrun's default of one each, and glibc's
    allocator told to keep freed memory for the next batch (tasks/allocator.py: ~1.3x training steps/s on CPU)."""
    env = dict(os.environ if base is None else base)
    project_root = str(Path(tasks.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (project_root, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // params.processes_per_node)))
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


def run_training(
    command: list[str],
    output_dir: str | os.PathLike[str],
    env: dict[str, str],
    *,
    log: Callable[[str], None] = print,
    on_metrics: Callable[[TrainingMetrics], None] = lambda metrics: None,
    poll_seconds: float = 1.0,
) -> ModelDirectory:
    """Run the torchrun command to completion; stream its lines to ``log``, new epochs to ``on_metrics``."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Enough of torchrun's output to hold its closing failure report.
    output: collections.deque[str] = collections.deque(maxlen=10 * LOG_TAIL_LINES)
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        env=env, start_new_session=True,
    )  # fmt: skip

    def pump() -> None:
        for line in process.stdout:
            output.append(line.rstrip("\n"))
            log(line.rstrip("\n"))

    reader = threading.Thread(target=pump, name="torchrun-output", daemon=True)
    reader.start()
    epochs_seen = -1
    try:
        while True:
            finished = process.poll() is not None
            metrics = read_metrics(output_dir)
            if metrics is not None and len(metrics.epochs) != epochs_seen:
                epochs_seen = len(metrics.epochs)
                on_metrics(metrics)
            if finished:
                break
            try:
                process.wait(timeout=poll_seconds)
            except subprocess.TimeoutExpired:
                pass
    finally:
        if process.poll() is None:
            # Cancelled or interrupted: take torchrun and all its workers down with us.
            os.killpg(process.pid, signal.SIGTERM)
            process.wait()
        reader.join(timeout=10)
    if process.returncode != 0:
        rank, how = failure_origin(output_dir, "\n".join(output))
        rank_log = driver_log_path(output_dir, rank) if rank is not None else None
        rank_tail = log_tail(rank_log) if rank_log else ""
        error_type = TrainingDivergedError if DIVERGED_MARKER in rank_tail else TrainingFailedError
        raise error_type(
            f"training failed (torchrun exit code {process.returncode})"
            + (f": rank {rank} first, {how}; its full log is {rank_log}" if rank is not None else ""),
            returncode=process.returncode,
            rank=rank,
            log_tail=rank_tail or "\n".join(list(output)[-LOG_TAIL_LINES:]),
        )
    return ModelDirectory(output_dir)


# --- Prefect task -------------------------------------------------------------------------------
import shlex  # noqa: E402

from prefect import get_run_logger, task  # noqa: E402
from prefect.artifacts import (  # noqa: E402
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE  # noqa: E402

from tasks.plots import plot_training_curves, png_markdown  # noqa: E402
from tasks.retrying import retry_unless_input_error  # noqa: E402


# One retry: the worker resumes from its last checkpoint, so a retry costs at most one epoch.
@task(name="train", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE)
def train(train_dir: str, validation_dir: str, model_spec_dir: str, output_dir: str, params: TrainingParams) -> str:
    """Artifacts ``training-progress`` (live, % of epochs) and ``training-metrics`` (one row per epoch)."""
    logger = get_run_logger()
    progress = create_progress_artifact(0.0, key="training-progress", description=f"epochs of {params.epochs} done")

    def on_metrics(metrics: TrainingMetrics) -> None:
        done = params.epochs if metrics.stopped_early else len(metrics.epochs)
        update_progress_artifact(progress, 100.0 * done / params.epochs)

    command = build_torchrun_command(
        train_dir=train_dir, validation_dir=validation_dir, model_spec_dir=model_spec_dir,
        output_dir=output_dir, params=params, run_id=Path(output_dir).parent.name,
    )  # fmt: skip
    logger.info("launching %s", shlex.join(command))
    model_dir = run_training(command, output_dir, worker_environment(params), log=logger.info, on_metrics=on_metrics)
    metrics = model_dir.metrics()
    update_progress_artifact(progress, 100.0)
    curves = model_dir.root / TRAINING_CURVES_FILE
    plot_training_curves(metrics, curves)
    create_markdown_artifact(
        key="training-curves", markdown=f"### Training curves\n\n{png_markdown(curves, 'loss and accuracy by epoch')}\n"
    )
    create_table_artifact(
        key="training-metrics",
        table=[epoch.model_dump() for epoch in metrics.epochs],
        description=f"best top-1 {metrics.best_top1:.4f} at epoch {metrics.best_epoch}"
        + (" (stopped early)" if metrics.stopped_early else "")
        + f"; curves in {curves}",
    )
    return str(model_dir.root)
