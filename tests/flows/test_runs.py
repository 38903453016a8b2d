"""`python -m flows.runs`: listing and pruning run folders through the real command line, on folders laid out as
the pipeline lays them out (run.json first), beside folders that are not runs and must survive."""

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from deployments.local import PROJECT_ROOT
from tasks.storage.runs import RUN_MARKER

DAY = 24 * 3600


def make_run(work_dir: Path, name: str, started: datetime, megabytes: int, age_s: float = DAY) -> Path:
    """A run folder as the pipeline leaves it (its marker, data, a model folder), its files ``age_s`` old."""
    run = work_dir / name
    (run / "model").mkdir(parents=True)
    (run / "data").mkdir()
    (run / RUN_MARKER).write_text(json.dumps({"kind": "train", "flow_run_id": name, "started": started.isoformat()}))
    (run / "data" / "images.bin").write_bytes(os.urandom(megabytes * 2**20))
    (run / "model" / "metrics.json").write_text("{}")
    stamp = time.time() - age_s
    for path in [run, *run.rglob("*")]:
        os.utime(path, (stamp, stamp))
    return run


def runs_command(*args: str, work_dir: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.runs", "--work-dir", str(work_dir), *args],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        timeout=120,
    )


@pytest.fixture
def work_dir(tmp_path) -> Path:
    work = tmp_path / "runs"
    for day in (1, 2, 3, 4):
        make_run(work, f"run-{day}-0000000{day}", datetime(2026, 11, day, tzinfo=timezone.utc), megabytes=day)
    # Not runs: the command lines' logs, a folder of the user's, a file; and a run still being written.
    (work / "logs").mkdir()
    (work / "logs" / "pipeline.log").write_text("kept")
    (work / "notes").mkdir()
    (work / "notes" / "mine.txt").write_text("kept")
    (work / "README").write_text("kept")
    make_run(work, "training-now-0000000f", datetime(2026, 10, 1, tzinfo=timezone.utc), megabytes=1, age_s=5)
    return work


def test_prune_keeps_the_newest_runs_prints_the_space_freed_and_touches_nothing_else(work_dir):
    listed = runs_command("list", work_dir=work_dir)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[-1] for line in listed.stdout.splitlines()[:-1]] == [
        str(work_dir / name)
        for name in ("training-now-0000000f", "run-1-00000001", "run-2-00000002", "run-3-00000003", "run-4-00000004")
    ]
    assert listed.stdout.splitlines()[-1] == "5 runs, 11.0 MB"

    dry = runs_command("prune", "--keep-last", "2", "--dry-run", work_dir=work_dir)
    assert dry.stdout.splitlines()[-1] == "would remove 2 runs, 3.0 MB to free; 3 kept"
    assert (work_dir / "run-1-00000001").is_dir()

    pruned = runs_command("prune", "--keep-last", "2", work_dir=work_dir)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.splitlines()[-1] == "removed 2 runs, 3.0 MB freed; 3 kept"
    assert sorted(p.name for p in work_dir.iterdir()) == [
        "README",
        "logs",
        "notes",
        "run-3-00000003",
        "run-4-00000004",
        "training-now-0000000f",  # older than both, but its files changed seconds ago: it may be training
    ]

    since = runs_command("prune", "--since", "2026-11-04", work_dir=work_dir)
    assert since.stdout.splitlines()[-1] == "removed 1 runs, 3.0 MB freed; 2 kept"
    assert not (work_dir / "run-3-00000003").exists() and (work_dir / "run-4-00000004").is_dir()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["prune"], "error: say which runs to keep: --keep-last N, --since YYYY-MM-DD, or both"),
        (["prune", "--keep-last", "-1"], "error: --keep-last must be 0 or more, not -1"),
        (["prune", "--since", "2026-13-01"], "not a date: '2026-13-01' (use YYYY-MM-DD)"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2_and_removes_nothing(work_dir, args, error):
    before = sorted(p.name for p in work_dir.iterdir())
    done = runs_command(*args, work_dir=work_dir)
    assert done.returncode == 2 and error in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert sorted(p.name for p in work_dir.iterdir()) == before


def test_a_work_dir_on_s3_is_pointed_at_lifecycle_rules():
    done = runs_command("list", work_dir="s3://bucket/runs")
    assert done.returncode == 2 and "give the bucket a lifecycle rule" in done.stderr
