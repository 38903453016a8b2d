"""The score and compare flows on a real Prefect server: S3 prefix and zip inputs, registry references on
disk and on S3, the PyTorch and ONNX runtimes."""

import asyncio
import shutil
import zipfile

import pandas as pd
import pytest

from flows.score import compare_models, score_pipeline
from tasks.contracts.model_directory import ModelDirectory
from tasks.evaluation.onnx_export import export_onnx
from tasks.registry import PromotionPolicy, register_model
from tasks.storage.s3 import s3_client
from tests.helpers import COLOURS, artifacts_and_task_runs, write_class_folders, write_image

pytestmark = pytest.mark.integration

NAME = "colours-resnet18"
PROBABILITIES = [f"Scored Probabilities_{c}" for c in sorted(COLOURS)]


def register_twice(registry, trained_model, tmp_path):
    """Version 1 (production) as trained; version 2 with its model.onnx."""
    register_model(
        registry,
        NAME,
        ModelDirectory(trained_model),
        metrics={"accuracy": 0.8},
        params={},
        datasets={},
        promotion=PromotionPolicy(promote_to="production"),
    )
    with_onnx = export_onnx(ModelDirectory(shutil.copytree(trained_model, tmp_path / "with-onnx")))
    register_model(registry, NAME, with_onnx, metrics={"accuracy": 0.9}, params={}, datasets={})


def run(flow, *args, **kwargs):
    """The flow's result and artifact keys; a score run's state message is its one-line headline."""
    state = flow(*args, return_state=True, **kwargs)
    artifacts, task_runs = asyncio.run(artifacts_and_task_runs(state.state_details.flow_run_id))
    keys = {artifact.key for artifact in artifacts}
    assert {t.state.type.value for t in task_runs} == {"COMPLETED"}
    if flow is score_pipeline:
        assert state.message == state.result().headline()
    return state.result(), keys


def test_labeled_s3_prefix_scored_by_alias_from_an_s3_registry(prefect_server, trained_model, s3_bucket, tmp_path):
    registry = f"s3://{s3_bucket}/models"
    register_twice(registry, trained_model, tmp_path)
    client = s3_client()
    for image in write_class_folders(tmp_path / "photos", 3, seed=7).rglob("*.png"):
        client.upload_file(str(image), s3_bucket, f"incoming/{image.parent.name}/{image.name}")
    result, keys = run(
        score_pipeline,
        f"s3://{s3_bucket}/incoming",
        f"{NAME}@production",
        output_csv=str(tmp_path / "out" / "scores.csv"),
        registry=registry,
        work_dir=str(tmp_path / "runs"),
    )

    table = pd.read_csv(result.scores, dtype=str)
    assert list(table.columns) == ["image", "Scored Labels", *PROBABILITIES, "label"] and len(table) == 9
    assert result.images == 9 and result.evaluation.images == 9
    assert result.evaluation.accuracy == pytest.approx((table["label"] == table["Scored Labels"]).mean())
    assert result.model_dir.endswith(f"{NAME}/1"), "the alias resolved to version 1, downloaded to the cache"
    assert {"score-images", "scores", "evaluation", "confusion-matrix"} <= keys
    assert result.headline() == (
        f"Scored 9 images with {result.model_dir} into {result.scores}; {result.evaluation.headline()}"
    )


def test_unlabeled_zip_through_onnx_by_version_and_a_folder_by_model_path(prefect_server, trained_model, tmp_path):
    registry = str(tmp_path / "registry")
    register_twice(registry, trained_model, tmp_path)
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        for i, colour in enumerate(sorted(COLOURS)):
            bundle.write(write_image(tmp_path / "loose" / f"{i}.png", COLOURS[colour], seed=40 + i), f"{i}.png")
    result, keys = run(
        score_pipeline, str(archive), f"{NAME}/2", registry=registry, runtime="onnx", work_dir=str(tmp_path / "runs")
    )

    table = pd.read_csv(result.scores, dtype={"image": str})
    assert list(table.columns) == ["image", "Scored Labels", *PROBABILITIES] and result.evaluation is None
    assert sorted(table["image"]) == ["0.png", "1.png", "2.png"]
    assert "scores" in keys and "evaluation" not in keys
    assert result.headline() == f"Scored 3 images with {result.model_dir} into {result.scores}"

    folder = write_class_folders(tmp_path / "photos", 2, classes=("red", "blue"), seed=9)
    result, keys = run(score_pipeline, str(folder), str(trained_model), work_dir=str(tmp_path / "runs"), top_k=2)
    assert result.model_dir == str(trained_model) and result.evaluation.classes == sorted(COLOURS)
    top = ["Top 1 Label", "Top 1 Probability", "Top 2 Label", "Top 2 Probability"]
    assert list(pd.read_csv(result.scores).columns) == ["image", "Scored Labels", *PROBABILITIES, *top, "label"]
    assert result.evaluation.per_class[1].support == 0, "green: a class the model knows but these images lack"

    rows, _ = run(compare_models, result.scores, f"{NAME}/2", registry=registry)
    accuracy = next(row for row in rows if row["figure"] == "accuracy")
    assert accuracy == {
        "figure": "accuracy",
        "scores.csv": result.evaluation.accuracy,
        f"{NAME}/2": 0.9,
        "difference": pytest.approx(0.9 - result.evaluation.accuracy),
    }
    assert {row["figure"] for row in rows} >= {"f1_weighted", "precision_macro", "images"}

    rows, keys = run(compare_models, f"{NAME}/1", f"{NAME}@production", registry=registry)
    assert rows == [{"figure": "accuracy", f"{NAME}/1 (left)": 0.8, f"{NAME}/1 (right)": 0.8, "difference": 0.0}]
    rows, keys = run(compare_models, f"{NAME}/1", f"{NAME}/2", registry=registry)
    assert rows[0]["difference"] == pytest.approx(0.1) and "model-comparison" in keys


def test_a_zip_of_one_folder_is_scored_unlabeled_under_the_users_names(prefect_server, trained_model, tmp_path):
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as bundle:
        for i, colour in enumerate(sorted(COLOURS)):
            bundle.write(
                write_image(tmp_path / "loose" / f"{i}.png", COLOURS[colour], seed=60 + i), f"red/{i}:{colour}.png"
            )
    result, keys = run(score_pipeline, str(archive), str(trained_model), work_dir=str(tmp_path / "runs"))

    table = pd.read_csv(result.scores, dtype={"image": str})
    assert result.evaluation is None and "label" not in table.columns and "evaluation" not in keys
    assert sorted(table["image"]) == ["red/0:blue.png", "red/1:green.png", "red/2:red.png"]
