"""End to end: the real flow on a real (temporary) Prefect server, with a real 2-process torchrun."""

import asyncio
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client

from flows.pipeline import train_pipeline
from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory, ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.errors import InvalidDatasetError
from tasks.evaluation.score import score_images
from tasks.registry import PromotionPolicy, list_versions, read_registration, resolve
from tasks.storage.runs import folder_size
from tests.helpers import artifacts_and_task_runs, progress_artifacts, write_class_folders

pytestmark = pytest.mark.integration

STAGE_ARTIFACTS = {
    "train-images",
    "validation-images",
    "label-validation",
    "model-spec",
    "training-progress",
    "training-metrics",
    "training-curves",
    "scores",
    "evaluation",
    "confusion-matrix",
    "registered-model",
    "onnx-export",
    "promotion",
    "misclassified-images",
}


async def flow_run_message(flow_run_id) -> str:
    async with get_client() as client:
        return (await client.read_flow_run(flow_run_id)).state.message


def test_train_pipeline_registers_a_trained_model(prefect_server, digits_subset, tmp_path):
    train, val = digits_subset
    training = TrainingParams(epochs=4, processes_per_node=2, learning_rate=0.002)
    result = train_pipeline(
        train_data=str(train),
        validation_data=str(val),
        model=ModelSpec(architecture="resnet18", pretrained=False),
        training=training,
        registry=str(tmp_path / "registry"),
        work_dir=str(tmp_path / "runs"),
        promotion=PromotionPolicy(promote_to="production", promotion_metric="f1_macro"),
        export_onnx=True,
    )

    assert result.model_name == "digits-resnet18" and result.version == 1
    assert list_versions(tmp_path / "registry", "digits-resnet18") == [1]
    registration = read_registration(tmp_path / "registry", "digits-resnet18", 1)
    assert registration.params["training"] == training.model_dump()
    assert registration.datasets["train"].images == 300 and registration.datasets["validation"].images == 100
    assert registration.flow_run_id
    assert "model.onnx" in registration.files and registration.metrics["f1_weighted"] > 0
    assert registration.promotion.promoted and registration.promotion.metric == "f1_macro"
    assert resolve(tmp_path / "registry", "digits-resnet18@production").version == 1

    # Sensible, not lucky: ten classes from 300 images in four epochs, far above chance (0.1).
    assert result.evaluation.images == 100 and result.evaluation.accuracy >= 0.7
    assert result.top1 == pytest.approx(result.evaluation.accuracy)
    assert ModelDirectory(result.location).classes == [str(d) for d in range(10)]
    assert "Registered digits-resnet18 version 1" in result.summary()
    assert "promoted to 'production' on f1_macro" in result.summary()
    # The run's state in the UI says the same in one line; the caller still got the PipelineResult.
    assert (
        asyncio.run(flow_run_message(registration.flow_run_id))
        == result.headline()
        == (
            f"Registered digits-resnet18 version 1 in {result.location}: top-1 {result.top1:.4g}, "
            f"F1 (macro) {result.evaluation.f1_macro:.4g} on 100 validation images"
        )
    )
    assert (Path(result.run_dir) / "confusion_matrix.png").stat().st_size > 0
    assert (Path(result.run_dir) / "model" / "training_curves.png").stat().st_size > 0

    # keep="results" (the default): the run keeps its data, metrics, logs, scores and pictures; the model files and
    # the checkpoints go, the registry holding the model, which still loads and scores the run's validation images.
    run, model_folder = Path(result.run_dir), Path(result.run_dir) / "model"
    assert not any((model_folder / name).exists() for name in ("checkpoints", "model.pt", "model.onnx"))
    assert json.loads((model_folder / "registered.json").read_text()) == {
        "name": "digits-resnet18",
        "version": 1,
        "location": result.location,
    }
    assert (run / "run.json").is_file() and (run / "scores.csv").is_file() and (model_folder / "metrics.json").is_file()
    assert result.run_size_bytes == folder_size(run) < 20 * 2**20
    assert f"run files (data, metrics, logs, scores; {folder_size(run) / 2**20:.1f} MB): {run}" in result.summary()
    rescored = score_images(ModelDirectory(result.location), ImageDirectory(run / "data" / "validation"))
    assert (rescored["Scored Labels"] == rescored["label"]).mean() == pytest.approx(result.evaluation.accuracy)

    artifacts, task_runs = asyncio.run(artifacts_and_task_runs(registration.flow_run_id))
    assert STAGE_ARTIFACTS | {"model-card-digits-resnet18"} <= {artifact.key for artifact in artifacts}
    # Every picture or page a person opens says its figure in one line beside it.
    undescribed = [a.key for a in artifacts if a.type == "markdown" and not (a.description or "").strip()]
    assert not undescribed and all("\n" not in a.description for a in artifacts if a.type == "markdown")
    assert {t.state.type.value for t in task_runs} == {"COMPLETED"}

    # Live curves: a version of training-curves each time the launcher's poll saw a new epoch, then the final one.
    curves = sorted((a for a in artifacts if a.key == "training-curves"), key=lambda a: a.created)
    epochs_seen = [int(m[1]) for a in curves[:-1] if (m := re.match(r"so far: (\d) of 4 epochs", a.description))]
    assert len(epochs_seen) == len(curves) - 1 >= 2, [a.description for a in curves]
    assert epochs_seen == sorted(set(epochs_seen)) and epochs_seen[0] < 4, "drawn while training went on"
    assert all("data:image/png;base64," in a.data for a in curves)
    assert curves[-1].description.startswith("best top-1 ")


def test_conversion_limits_reach_the_convert_stage(prefect_server, tmp_path):
    train = write_class_folders(tmp_path / "train", 3)
    val = write_class_folders(tmp_path / "val", 2, seed=1)
    with pytest.raises(InvalidDatasetError, match=r"16x16 pixels \(256\), over the limit of 100 \(max_image_pixels\)"):
        train_pipeline(
            train_data=str(train),
            validation_data=str(val),
            conversion=ConversionLimits(max_image_pixels=100),
            model=ModelSpec(pretrained=False),
            registry=str(tmp_path / "registry"),
            work_dir=str(tmp_path / "runs"),
        )
    assert not list((tmp_path / "runs").glob("*/model"))


def test_a_worker_killed_mid_training_is_resumed_by_the_prefect_retry(prefect_server, digits_subset, tmp_path):
    """torchrun without restarts fails when a worker dies; the train task's retry resumes from the checkpoint."""
    from tests.helpers import worker_pids

    train, val = digits_subset
    training = TrainingParams(epochs=3, processes_per_node=1, learning_rate=0.002, max_restarts=0)
    killed, stop = [], threading.Event()

    def kill_a_worker_after_the_first_epoch():
        while not stop.is_set() and not killed:
            for metrics_file in (tmp_path / "runs").glob("*/model/metrics.json"):
                if '"epoch": 1' in metrics_file.read_text() and (pids := worker_pids(metrics_file.parent)):
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
            time.sleep(0.1)

    killer = threading.Thread(target=kill_a_worker_after_the_first_epoch)
    killer.start()
    try:
        result = train_pipeline(
            train_data=str(train),
            validation_data=str(val),
            model=ModelSpec(pretrained=False),
            training=training,
            registry=str(tmp_path / "registry"),
            work_dir=str(tmp_path / "runs"),
            keep="all",
        )
    finally:
        stop.set()
        killer.join()

    assert killed, "training finished before a worker could be killed"
    model_dir = Path(result.run_dir) / "model"
    # keep="all": the run keeps the model files and the checkpoint beside what the registry holds.
    assert (model_dir / "checkpoints" / "last.pt").is_file() and not (model_dir / "registered.json").exists()
    assert "run files (data, model, logs, scores; " in result.summary()
    assert [e.epoch for e in ModelDirectory(model_dir).metrics().epochs] == [1, 2, 3]
    assert "resuming from" in (model_dir / "logs" / "driver_log_0.txt").read_text()
    _, task_runs = asyncio.run(artifacts_and_task_runs(result.registration.flow_run_id))
    train_run = next(t for t in task_runs if t.name.startswith("train"))
    assert train_run.run_count == 2 and train_run.state.is_completed()
    # The retry carries on the first attempt's progress bar instead of leaving it stuck part-way.
    progress = asyncio.run(progress_artifacts(train_run.id))
    assert [(p.data, p.description) for p in progress] == [(100.0, "3 of 3 epochs")]
