"""End to end: the real flow on a real (temporary) Prefect server, with a real 2-process torchrun; the approval form
answered in the Prefect UI (headless Chromium)."""

import asyncio
import hashlib
import io
import json
import os
import re
import shutil
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torchvision
from prefect.client.orchestration import get_client

from deployments.local import PROJECT_ROOT
from flows.pipeline import train_pipeline
from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory, ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.contracts.transformations import ImageTransformations, RandomRotation
from tasks.errors import InvalidDatasetError
from tasks.evaluation.score import score_images
from tasks.launch.torchrun_output import read_metrics
from tasks.registry import PromotionPolicy, list_versions, read_registration, resolve
from tasks.registry.manage import show_version
from tasks.storage.runs import folder_size
from tests.browser import (
    chromium,
    click_text,
    field,
    latest_artifact_id,
    paused_run_id,
    table_overflow,
    wait_for_text,
)
from tests.helpers import artifacts_and_task_runs, progress_artifacts, worker_pids, write_class_folders

pytestmark = pytest.mark.integration

SHOTS = PROJECT_ROOT / "build" / "ui-check"

# One folder given: its conversion and the split stand where two folders' conversions (train-images,
# validation-images: tests/deployments/test_deployments.py) would.
STAGE_ARTIFACTS = {
    "source-images",
    "split",
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


def shared_server() -> SimpleNamespace:
    """The shared server as the browser reaches it: its API's and its UI's addresses."""
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    return SimpleNamespace(api_url=api_url, url=api_url.removesuffix("/api"))


def answer_the_approval_form_in_the_ui(running: Future, registry: Path, driver) -> str:
    """The paused run's approval form, opened from the run's page in headless Chromium against the shared server,
    answered (approve, reviewer, comment) and submitted; the run's id. The form is screenshotted into SHOTS."""
    server = shared_server()
    # Other tests pause runs on the shared server too: this one is the pipeline's run with this test's registry.
    run_id = paused_run_id(server, running, flow="train-pipeline", registry=str(registry))
    driver.get(f"{server.url}/runs/flow-run/{run_id}")
    wait_for_text(driver, ["Paused", "Resume"])
    click_text(driver, "Resume")
    form = wait_for_text(
        driver,
        [
            "Promote digits-resnet18 version 1 to production?",
            "challenger: version 1",
            "Decision",
            "Reviewer",  # required: the record names who decided
            "Comment (Optional)",
        ],
    )
    assert "f1_macro (decides)" in form and "Reviewer (Optional)" not in form
    field(driver, "Decision", "div[contains(@class, 'p-select')]").click()
    click_text(driver, "approve")
    field(driver, "Reviewer", "textarea").send_keys("ada")
    field(driver, "Comment", "textarea").send_keys("looks right")
    driver.save_screenshot(str(SHOTS / "approval-form.png"))
    click_text(driver, "Submit")
    # The answer reached the server once the run leaves Paused (the page, as a person sees it, if it never does).
    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while client.read_flow_run(run_id).state.is_paused():
            if time.monotonic() > deadline:
                driver.save_screenshot(str(SHOTS / "approval-submitted.png"))
                page = driver.find_element("tag name", "body").text
                raise AssertionError(f"the run is still paused 60 s after Submit; the page shows:\n{page[:2000]}")
            time.sleep(1)
    return run_id


def test_one_folder_fine_tuned_from_fetched_weights_survives_a_killed_worker_and_is_promoted_once_approved_in_the_ui(
    prefect_server, digits_subset, server, torch_home, tmp_path
):
    """Your own images to an approved model, the whole pipeline in this process on the shared server. One folder is
    split; a ResNet-18 starts from pretrained weights fetched from a mirror (HTTP on loopback) and hash-checked,
    trains on 2 processes with a random rotation, exports to ONNX and is registered. torchrun without restarts
    fails when a worker dies after the first epoch; the train task's retry resumes from the checkpoint. The
    promotion waits for a person's approval, given in the Prefect UI's form (headless Chromium), and the model card
    records it, the split, the transformations and the weights. The screenshots land in build/ui-check/ (the
    README's docs/images/ pictures are made the same way by docs/screenshots.py).

    The weights are a state dict of our own (real ImageNet files cannot be fetched here) with its real sha256."""
    photos = tmp_path / "digits"  # one folder: the digits' 40 images of each class
    for part in digits_subset:
        shutil.copytree(part, photos, dirs_exist_ok=True)
    buffer = io.BytesIO()
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), buffer)
    weights, sha256 = buffer.getvalue(), hashlib.sha256(buffer.getvalue()).hexdigest()
    server.files["/models/resnet18-own.pth"] = weights
    training = TrainingParams(epochs=4, processes_per_node=2, learning_rate=0.002, max_restarts=0)
    registry = tmp_path / "registry"
    killed, stop = [], threading.Event()

    def kill_a_worker_after_the_first_epoch():
        while not stop.is_set() and not killed:
            for metrics_file in (tmp_path / "runs").glob("*/model/metrics.json"):
                if '"epoch": 1' in metrics_file.read_text() and (pids := worker_pids(metrics_file.parent)):
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
            time.sleep(0.1)

    SHOTS.mkdir(parents=True, exist_ok=True)
    driver = chromium(tmp_path / "chromium")
    killer = threading.Thread(target=kill_a_worker_after_the_first_epoch)
    killer.start()
    try:
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(
                train_pipeline,
                train_data=str(photos),
                validation_fraction=0.25,
                model=ModelSpec(
                    architecture="resnet18",
                    weights_path=f"{server.url}/models/resnet18-own.pth",
                    weights_sha256=sha256,
                    transformations=ImageTransformations(random_rotation=RandomRotation()),
                ),  # pretrained left empty: your own images start from the pretrained weights
                training=training,
                registry=str(registry),
                work_dir=str(tmp_path / "runs"),
                promotion=PromotionPolicy(
                    promote_to="production", promotion_metric="f1_macro", approval=True, approval_timeout_s=300
                ),
                export_onnx=True,
            )
            run_id = answer_the_approval_form_in_the_ui(running, registry, driver)
            result = running.result(timeout=300)

        assert show_version(registry, "digits-resnet18/1").approval.reviewer == "ada"
        server_ui = shared_server()
        card_id = latest_artifact_id(server_ui, "model-card-digits-resnet18", run_id)
        driver.get(f"{server_ui.url}/artifacts/artifact/{card_id}")
        driver.set_window_size(1440, 900)
        wait_for_text(driver, ["Model card: digits-resnet18", "approved by ada", "“looks right”", "production"])
        driver.save_screenshot(str(SHOTS / "model-card.png"))
        # The card's table fits a 1440 px window: the box around it (which scrolls what does not fit) needs no scroll.
        assert table_overflow(driver) <= 0, f"the model card's table is {table_overflow(driver)} px too wide at 1440 px"
    finally:
        stop.set()
        killer.join()
        driver.quit()
    assert all((SHOTS / name).stat().st_size > 10_000 for name in ("approval-form.png", "model-card.png"))

    assert result.model_name == "digits-resnet18" and result.version == 1
    assert "approved by ada: looks right" in result.summary(), result.summary()
    assert list_versions(registry, "digits-resnet18") == [1]
    registration = read_registration(registry, "digits-resnet18", 1)
    assert registration.params["training"] == training.model_dump()
    assert registration.flow_run_id
    assert "model.onnx" in registration.files and registration.metrics["f1_weighted"] > 0
    # The record says the version awaited approval; the answer and the promotion are the version's status (above).
    assert registration.promotion.awaiting_approval and registration.promotion.metric == "f1_macro"
    assert result.registration.promotion.promoted and result.registration.promotion.approval.decision == "approved"
    assert resolve(registry, "digits-resnet18@production").version == 1

    # The split: a quarter of each class's 40 images validate, and each side's manifest says where it came from.
    validation = ImageDirectory(Path(result.run_dir) / "data" / "validation")
    assert registration.datasets["validation"].images == len(validation) == result.evaluation.images == 100
    assert registration.datasets["train"].images == 300
    assert validation.manifest.split.side == "second" and validation.manifest.split.fraction == pytest.approx(0.75)
    assert registration.datasets["validation"].split == validation.manifest.split
    # The weights were fetched once (not again by the retry), checked, and recorded by name and hash; the model was
    # trained from them.
    assert server.requests == ["/models/resnet18-own.pth"]
    trained = ModelDirectory(result.location)
    assert trained.spec.pretrained and trained.spec.weights.sha256 == sha256
    assert registration.params["pretrained_weights"]["sha256"] == sha256
    assert trained.spec.transformations.random_rotation == RandomRotation()
    assert trained.classes == [str(d) for d in range(10)]

    # Sensible, not lucky: ten classes from 300 images in four epochs, far above chance (0.1).
    assert result.evaluation.accuracy >= 0.7
    assert result.top1 == pytest.approx(result.evaluation.accuracy)
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

    # The killed worker: the first attempt failed, the retry resumed from its checkpoint and trained the rest.
    assert killed, "training finished before a worker could be killed"
    run, model_folder = Path(result.run_dir), Path(result.run_dir) / "model"
    assert [e.epoch for e in read_metrics(model_folder).epochs] == [1, 2, 3, 4]
    assert "resuming from" in (model_folder / "logs" / "driver_log_0.txt").read_text()
    artifacts, task_runs = asyncio.run(artifacts_and_task_runs(registration.flow_run_id))
    train_run = next(t for t in task_runs if t.name.startswith("train"))
    assert train_run.run_count == 2 and train_run.state.is_completed()
    assert {t.state.type.value for t in task_runs} == {"COMPLETED"}
    # The retry carries on the first attempt's progress bar instead of leaving it stuck part-way.
    progress = asyncio.run(progress_artifacts(train_run.id))
    assert [(p.data, p.description) for p in progress] == [(100.0, "4 of 4 epochs")]

    # keep="results" (the default): the run keeps its data, metrics, logs, scores and pictures; the model files and
    # the checkpoints go, the registry holding the model, which still loads and scores the run's validation images.
    assert not any((model_folder / name).exists() for name in ("checkpoints", "model.pt", "model.onnx"))
    assert json.loads((model_folder / "registered.json").read_text()) == {
        "name": "digits-resnet18",
        "version": 1,
        "location": result.location,
    }
    assert (run / "run.json").is_file() and (run / "scores.csv").is_file() and (model_folder / "metrics.json").is_file()
    assert result.run_size_bytes == folder_size(run) < 20 * 2**20
    assert f"run files (data, metrics, logs, scores; {folder_size(run) / 2**20:.1f} MB): {run}" in result.summary()
    assert "run files (data, model, logs, scores; " in result.model_copy(update={"keep": "all"}).summary()
    rescored = score_images(ModelDirectory(result.location), validation)
    assert (rescored["Scored Labels"] == rescored["label"]).mean() == pytest.approx(result.evaluation.accuracy)

    assert STAGE_ARTIFACTS | {"model-card-digits-resnet18"} <= {artifact.key for artifact in artifacts}
    card = next(a for a in artifacts if a.key == "model-card-digits-resnet18").data
    assert sha256[:12] in card and "random rotation" in card
    assert "75% of" in card and "split with seed 1" in card
    # Every picture or page a person opens says its figure in one line beside it.
    undescribed = [a.key for a in artifacts if a.type == "markdown" and not (a.description or "").strip()]
    assert not undescribed and all("\n" not in a.description for a in artifacts if a.type == "markdown")

    # Live curves: a version of training-curves each time a launcher's poll saw a new epoch, then the final one
    # (the retry's launcher draws again from the epoch it resumed after).
    curves = sorted((a for a in artifacts if a.key == "training-curves"), key=lambda a: a.created)
    epochs_seen = [int(m[1]) for a in curves[:-1] if (m := re.match(r"so far: (\d) of 4 epochs", a.description))]
    assert len(epochs_seen) == len(curves) - 1 >= 2, [a.description for a in curves]
    assert epochs_seen == sorted(epochs_seen) and epochs_seen[0] < 4, "drawn while training went on"
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
