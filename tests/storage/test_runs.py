"""What a registered run's folder keeps (``drop_registered_copies``, and a sweep's other trials:
``drop_unregistered_models``), on folders laid out as the pipeline and the sweep lay them out; listing and pruning
runs are tested through their command line (tests/flows/test_runs.py)."""

import json
import os
from pathlib import Path

import pytest

from tasks.contracts.model_directory import SPEC_FILE, STAGED_WEIGHTS_FILE
from tasks.storage.runs import (
    REGISTERED_NOTE,
    RUN_MARKER,
    disk_usage,
    drop_registered_copies,
    drop_unregistered_models,
    folder_size,
)
from tasks.sweep.study import trial_folder

REGISTERED = {"name": "digits-resnet18", "version": 3, "location": "/registry/digits-resnet18/3"}


# A trained model's folder and the untrained model directory beside it, as a run or a sweep's trial holds them.
MODEL_FILES = {
    f"model_spec/{SPEC_FILE}": 400,
    f"model_spec/{STAGED_WEIGHTS_FILE}": 450_000,
    "model/model.pt": 300_000,
    "model/model.onnx": 200_000,
    "model/checkpoints/last.pt": 600_000,
    "model/checkpoints/rank-1/last.pt": 10_000,
    "model/metrics.json": 500,
    "model/training_curves.png": 3_000,
    "model/logs/driver_log_0.txt": 1_000,
}
# What keep="results" drops of them.
MODEL_COPIES = {"model/model.pt", "model/model.onnx", f"model_spec/{STAGED_WEIGHTS_FILE}"}


def write_files(root: Path, files: dict[str, int]) -> Path:
    for name, size in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(os.urandom(size))
    return root


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished run: its marker, data, scores, the untrained model directory with its staged pretrained weights,
    and a model folder with weights, an export, checkpoints, metrics and logs."""
    files = {RUN_MARKER: 64, "data/train/0/a.png": 2_000, "scores.csv": 300, "confusion_matrix.png": 5_000}
    return write_files(tmp_path / "train-pipeline-0a1b2c3d", {**files, **MODEL_FILES})


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
    gone = {name for name in before if name.startswith("model/checkpoints/")} | MODEL_COPIES
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


def test_a_sweep_s_other_trials_keep_their_figures_and_lose_their_models_checkpoints_and_staged_weights(tmp_path):
    best, *others = [trial_folder(number) for number in range(3)]
    files = {f"{trial}/{name}": size for trial in (best, *others) for name, size in MODEL_FILES.items()}
    run = write_files(tmp_path / "sweep-0a1b2c3d", {RUN_MARKER: 64, **files})
    before = listing(run)
    gone = {
        f"{trial}/{name}"
        for trial in others
        for name in MODEL_FILES
        if name.startswith("model/checkpoints/") or name in MODEL_COPIES
    }
    dropped = sum(disk_usage((run / name).lstat()) for name in gone)
    models = [str(run / trial / "model") for trial in others]

    assert drop_unregistered_models(models, "all") == 0 and listing(run) == before
    on_s3 = "s3://bucket/runs/sweep-0a1b2c3d/trials/trial-003/model"  # left to the bucket's lifecycle rules
    assert drop_unregistered_models([*models, on_s3], "results") == dropped > 2_000_000

    after = listing(run)
    assert set(before) - set(after) == gone
    assert all(after[name] == content for name, content in before.items() if name not in gone), "the rest untouched"
    assert not any(name.endswith(REGISTERED_NOTE) for name in after), "no trial but the best is registered"
