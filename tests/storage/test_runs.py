"""What a registered run's folder keeps (``drop_registered_copies``), on a folder laid out as the pipeline lays it
out; listing and pruning runs are tested through their command line (tests/flows/test_runs.py)."""

import json
import os
from pathlib import Path

import pytest

from tasks.contracts.model_directory import SPEC_FILE, STAGED_WEIGHTS_FILE
from tasks.storage.runs import REGISTERED_NOTE, RUN_MARKER, disk_usage, drop_registered_copies, folder_size

REGISTERED = {"name": "digits-resnet18", "version": 3, "location": "/registry/digits-resnet18/3"}


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished run: its marker, data, scores, the untrained model directory with its staged pretrained weights,
    and a model folder with weights, an export, checkpoints, metrics and logs."""
    run = tmp_path / "train-pipeline-0a1b2c3d"
    files = {
        RUN_MARKER: 64,
        "data/train/0/a.png": 2_000,
        "scores.csv": 300,
        f"model_spec/{SPEC_FILE}": 400,
        f"model_spec/{STAGED_WEIGHTS_FILE}": 450_000,
        "confusion_matrix.png": 5_000,
        "model/model.pt": 300_000,
        "model/model.onnx": 200_000,
        "model/checkpoints/last.pt": 600_000,
        "model/checkpoints/rank-1/last.pt": 10_000,
        "model/metrics.json": 500,
        "model/logs/driver_log_0.txt": 1_000,
    }
    for name, size in files.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(os.urandom(size))
    return run


def listing(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_keep_results_drops_the_model_s_copies_the_checkpoints_and_the_staged_weights_and_says_where_the_model_is(
    run,
):
    before, size = listing(run), folder_size(run)
    model = run / "model"
    files = [model / "model.pt", model / "model.onnx", run / "model_spec" / STAGED_WEIGHTS_FILE]
    dropped = folder_size(model / "checkpoints") + sum(disk_usage(path.lstat()) for path in files)

    freed = drop_registered_copies(str(run), str(model), REGISTERED, "results")

    assert freed == dropped > 1_000_000
    assert folder_size(run) == size - freed + disk_usage((model / REGISTERED_NOTE).lstat())
    after = listing(run)
    gone = {name for name in before if name.startswith("model/checkpoints/")}
    gone |= {"model/model.pt", "model/model.onnx", f"model_spec/{STAGED_WEIGHTS_FILE}"}
    assert set(before) - set(after) == gone
    assert all(after[name] == content for name, content in before.items() if name not in gone), "the rest untouched"
    assert json.loads(after[f"model/{REGISTERED_NOTE}"]) == REGISTERED


def test_keep_all_touches_nothing(run):
    before = listing(run)
    assert drop_registered_copies(str(run), str(run / "model"), REGISTERED, "all") == 0
    assert listing(run) == before


def test_a_run_folder_on_s3_is_left_to_its_bucket_s_lifecycle_rules():
    # Nothing is listed or deleted: the call returns before reaching any endpoint (none is configured here).
    assert drop_registered_copies("s3://bucket/runs/r-0a1b2c3d", "s3://bucket/runs/r-0a1b2c3d/model", REGISTERED) == 0
