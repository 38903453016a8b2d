"""Run folders that do not fill the disk: what a finished run keeps, how big each run is, and pruning old runs.

A run folder (``<work_dir>/<flow run name>-<id>``) holds the converted data, the model folder (checkpoints, the
best weights, metrics, logs, curves), the scores table and the pictures. Once its version is registered, the
registry holds its own copy of the model files (model.pt, model.onnx) and the checkpoints serve no retry any more:
with ``keep="results"`` (the flows' default) they go, with the copy of the pretrained weights staged in
``model_spec/``, and ``model/registered.json`` says where the model now is.
The data, metrics, logs, scores and pictures, what the run's page and artifacts point at, stay. A sweep's other
trials lose the same files (``drop_unregistered_models``): their figures stay. ``keep="all"`` keeps everything.
A registered model is never touched: it lives in the registry, never in a run folder.

``prune_runs`` (``python -m flows.runs prune``) removes whole run folders, oldest first, keeping the newest N or
those newer than a date. It recognises a run folder by the ``run.json`` every run writes first (or, for a folder
from before that, a ``<name>-<8 hex digits>`` folder holding ``model_spec/``), never removes anything else, and
leaves alone a run whose files changed in the last ``BUSY_SECONDS`` (it may be training).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from tasks.errors import PipelineInputError
from tasks.storage.s3 import is_s3_uri

Keep = Literal["results", "all"]
RUN_MARKER = "run.json"
REGISTERED_NOTE = "registered.json"
# What a registered run's model folder drops under keep="results": the registry holds the model files, and the
# checkpoints only served a retry of the training.
DROPPED = ("checkpoints", "model.pt", "model.onnx")
# And beside the model folder: the weights staged for the training nodes in the untrained model directory (the
# pretrained ones, tasks/model/untrained.py; a registered version's for a warm start, tasks/model/warm_start.py);
# the version records their origin and hash.
STAGED_WEIGHTS = ("model_spec", ("pretrained_weights.pth", "warm_start.pt"))
BUSY_SECONDS = 600
_LEGACY_NAME = re.compile(r".+-[0-9a-f]{8}")


def disk_usage(status: os.stat_result) -> int:
    """Bytes a file takes on its disk (whole blocks, as ``du`` counts: thousands of small images take far more
    than their sizes add up to)."""
    return status.st_blocks * 512


def folder_size(root: Path) -> int:
    """Bytes the files below ``root`` take on disk (links not followed)."""
    return sum(disk_usage(p.lstat()) for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def run_folder_location(work_dir: str, name: str) -> str:
    """The run folder ``name`` under ``work_dir`` (a path, made absolute, or s3://bucket/prefix)."""
    return f"{work_dir.rstrip('/')}/{name}" if is_s3_uri(work_dir) else str(Path(work_dir).resolve() / name)


def mark_run(run_dir: str, kind: str, flow_run_id: str) -> None:
    """Write ``run.json`` in a local run folder (what ``prune_runs`` recognises); an S3 run folder has its
    bucket's lifecycle rules instead."""
    if is_s3_uri(run_dir):
        return
    root = Path(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / RUN_MARKER
    if not marker.exists():  # a retried run keeps its first record
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        marker.write_text(json.dumps({"kind": kind, "flow_run_id": flow_run_id, "started": started}) + "\n")


def drop_registered_copies(run_dir: str, model_dir: str, registered: dict, keep: Keep = "results") -> int:
    """Under ``keep="results"``, drop the registered model's files and the checkpoints from a local run's model
    folder, and the staged pretrained weights beside it, and write where the model now is; under ``keep="all"``
    touch nothing. Bytes freed (0 for an S3 run folder, which its bucket's lifecycle rules govern)."""
    if keep == "all" or is_s3_uri(run_dir) or is_s3_uri(model_dir):
        return 0
    freed = _drop_model_files(Path(model_dir))
    (Path(model_dir) / REGISTERED_NOTE).write_text(json.dumps(registered, indent=2) + "\n")
    return freed


def drop_unregistered_models(model_dirs: Sequence[str], keep: Keep = "results") -> int:
    """Under ``keep="results"``, once a sweep's best trial is registered: the other trials' model files,
    checkpoints and staged pretrained weights, from their local model folders (their metrics, curves and logs
    stay); under ``keep="all"``, or on S3, nothing. Bytes freed."""
    if keep == "all":
        return 0
    return sum(_drop_model_files(Path(folder)) for folder in model_dirs if not is_s3_uri(folder))


def _drop_model_files(model: Path) -> int:
    """A model folder's ``DROPPED`` files and the ``STAGED_WEIGHTS`` beside it, removed: the bytes they took."""
    freed = 0
    folder, staged = STAGED_WEIGHTS
    for path in [*(model / name for name in DROPPED), *(model.parent / folder / name for name in staged)]:
        if path.is_dir():
            freed += folder_size(path)
            shutil.rmtree(path)
        elif path.is_file():
            freed += disk_usage(path.lstat())
            path.unlink()
    return freed


def run_size(run_dir: str) -> int | None:
    """Bytes a local run folder holds (None for an S3 one)."""
    return None if is_s3_uri(run_dir) else folder_size(Path(run_dir))


@dataclass(frozen=True)
class RunFolder:
    path: Path
    started: float  # seconds since the epoch
    changed: float  # newest file's modification time
    size: int


def is_run_folder(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return False
    return (path / RUN_MARKER).is_file() or (bool(_LEGACY_NAME.fullmatch(path.name)) and (path / "model_spec").is_dir())


def _started(path: Path) -> float:
    try:
        return datetime.fromisoformat(json.loads((path / RUN_MARKER).read_text())["started"]).timestamp()
    except (OSError, ValueError, KeyError, TypeError):
        return path.stat().st_mtime


def list_runs(work_dir: str) -> list[RunFolder]:
    """The run folders directly below a local ``work_dir``, oldest first."""
    if is_s3_uri(work_dir):
        raise PipelineInputError(
            f"runs prune works on a local work_dir, not {work_dir}: on S3, give the bucket a lifecycle rule that "
            "expires old objects under that prefix"
        )
    root = Path(work_dir)
    if not root.is_dir():
        raise PipelineInputError(f"work_dir {root} does not exist")
    runs = []
    for path in root.iterdir():
        if is_run_folder(path):
            files = [p.lstat() for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
            changed = max((f.st_mtime for f in files), default=path.stat().st_mtime)
            runs.append(RunFolder(path, _started(path), changed, sum(map(disk_usage, files))))
    return sorted(runs, key=lambda run: (run.started, run.path.name))


def prune_runs(
    work_dir: str, keep_last: int | None = None, since: datetime | None = None, dry_run: bool = False
) -> tuple[list[RunFolder], list[RunFolder]]:
    """(removed, kept) run folders: every run but the newest ``keep_last`` and those started at or after
    ``since`` goes, unless its files changed in the last BUSY_SECONDS. Nothing is removed with ``dry_run``."""
    if keep_last is None and since is None:
        raise PipelineInputError("say which runs to keep: --keep-last N, --since YYYY-MM-DD, or both")
    if keep_last is not None and keep_last < 0:
        raise PipelineInputError(f"--keep-last must be 0 or more, not {keep_last}")
    runs = list_runs(work_dir)
    newest = set(map(id, runs[len(runs) - keep_last :] if keep_last else []))
    cutoff = since.timestamp() if since is not None else None
    now = time.time()
    removed, kept = [], []
    for run in runs:
        wanted = id(run) in newest or (cutoff is not None and run.started >= cutoff)
        if wanted or now - run.changed < BUSY_SECONDS:
            kept.append(run)
            continue
        if not dry_run:
            shutil.rmtree(run.path)
        removed.append(run)
    return removed, kept
