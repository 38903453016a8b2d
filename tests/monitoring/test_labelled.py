"""tasks/monitoring/labelled.py: a sorted labelling queue joins the training images only, deduplicated by sha256
against train and validation; one image under two classes, or a class the data lacks, is one line (before any
work from the command line, exit 2); on the real server the pipeline's data step publishes the per-class counts and
announces the batch with the event the retraining automation matches (never its own)."""

import asyncio
import shutil
from collections import Counter
from datetime import timedelta
from pathlib import Path
from uuid import uuid4

import numpy as np
import pytest
import torch
from prefect import flow
from prefect.client.orchestration import get_client

from deployments.automations import LABELLED_PARAMETERS, labelled_automation
from flows.cli import main as image_classifier
from flows.pipeline import prepare_data
from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import TrainedModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError, LabelConflictError
from tasks.monitoring.events import LABELLED_EVENT, TRAINING_FLOW, model_name_resource
from tasks.monitoring.labelled import add_labelled, check_labelled_folder
from tasks.monitoring.prefect_tasks import LABELLED_ARTIFACT_KEY
from tasks.training.data import TrainingData, drawn_rows
from tasks.training.distributed import DistributedEnv
from tests.conftest import drain_prefect_workers
from tests.helpers import COLOURS, artifacts_and_task_runs, main_in_process, wait_for, write_image


def sorted_queue(root: Path, train_source: Path, validation_source: Path) -> Path:
    """What a person leaves of a labelling queue: two photos already trained on, one of the validation set, three new
    ones (one of them twice, in two subfolders of its class) and the queue's CSV."""
    for name in ("red", "blue"):
        (root / name).mkdir(parents=True)
    shutil.copy(train_source / "red" / "red_0.png", root / "red" / "a.png")
    shutil.copy(train_source / "blue" / "blue_1.png", root / "blue" / "b.png")
    shutil.copy(validation_source / "green" / "green_0.png", root / "red" / "c.png")  # a validation image: skipped
    for i, name in enumerate(("red", "blue", "blue")):
        write_image(root / name / f"new_{i}.png", COLOURS[name], seed=900 + i)
    (root / "blue" / "again").mkdir()
    shutil.copy(root / "blue" / "new_1.png", root / "blue" / "again" / "new_1.png")
    (root / "queue.csv").write_text("sha256,predicted label,confidence,time,file,why\n")
    return root


@pytest.fixture
def queue(colour_image_dirs, tmp_path) -> Path:
    train, _ = colour_image_dirs
    return sorted_queue(tmp_path / "to-label", train.parent / "src-train", train.parent / "src-val")


def test_only_new_images_join_the_training_side_counted_per_class(colour_image_dirs, queue, tmp_path):
    train, validation = (ImageDirectory(d) for d in colour_image_dirs)
    before = {p: p.stat().st_mtime_ns for p in queue.rglob("*")}
    check_labelled_folder(str(queue), set(train.classes))
    check_labelled_folder(str(queue.parent), set(train.classes))  # a folder wrapping it
    labelled = convert_to_image_directory(queue, tmp_path / "labelled")
    merged, batch = add_labelled(train, validation, labelled, tmp_path / "train-labelled", str(queue))

    assert batch.added == {"blue": 2, "green": 0, "red": 1}
    assert batch.in_train == {"blue": 1, "green": 0, "red": 1}
    assert batch.in_validation == {"blue": 0, "green": 0, "red": 1}
    assert batch.repeated == {"blue": 1, "green": 0, "red": 0}
    assert merged.manifest.counts == {c: n + batch.added[c] for c, n in train.manifest.counts.items()}
    assert len(merged) == batch.train_images == len(train) + 3
    assert merged.manifest.source == train.manifest.source  # the model's default name stays the data set's
    new = sorted(p for p in merged.index.path if "/labelled-" in p)
    assert [p.split("/")[0] for p in new] == ["blue", "blue", "red"]
    assert all((merged.root / p).is_file() for p in merged.index.path)
    # Training draws the 3 labelled images 8 times an epoch: half of its 48 draws (TrainingParams.labelled_share).
    labelled_rows = merged.labelled_rows()
    assert sorted(merged.index.path[i] for i in labelled_rows) == new
    drawn = drawn_rows(merged, 0.5)
    assert len(drawn) == 48 and sorted(Counter(drawn.tolist()).values()) == [1] * len(train) + [8] * 3
    assert np.isin(drawn, labelled_rows).sum() == 24
    assert drawn_rows(merged, 0) is drawn_rows(merged, 0.1) is drawn_rows(train, 0.5) is None  # 0, reached, none
    spec, world = TrainedModelSpec(num_classes=3, image_size=32), DistributedEnv(0, 1, 0, 1, 0)
    data = TrainingData.load(merged, validation, spec, TrainingParams(labelled_share=0.5), world, torch.device("cpu"))
    dealt = [data.sampler.dataset.indices[i] for i in data.sampler]  # the training images' rows an epoch draws
    assert sorted(dealt) == sorted(drawn.tolist())
    assert data.labelled == "3 images of labelled batches drawn 8 times an epoch: 50% of its 48 draws (labelled_share)"
    assert batch.headline() == (
        f"3 labelled images from {queue} added to the training images ({len(train) + 3} now); 3 skipped as already "
        "in train or validation, 1 repeated in the batch"
    )
    assert batch.payload()["labelled_data"] == str(queue)
    assert {p: p.stat().st_mtime_ns for p in queue.rglob("*")} == before, "the user's folder is left as it was"


def test_one_image_under_two_classes_is_one_line_naming_both_paths(colour_image_dirs, queue, tmp_path):
    train, validation = (ImageDirectory(d) for d in colour_image_dirs)
    shutil.copy(queue / "red" / "new_0.png", queue / "blue" / "moved.png")
    with pytest.raises(LabelConflictError) as told:
        check_labelled_folder(str(queue))
    said = str(told.value)
    assert f"{queue / 'blue' / 'moved.png'} (blue)" in said and f"{queue / 'red' / 'new_0.png'} (red)" in said
    assert "\n" not in said
    labelled = convert_to_image_directory(queue, tmp_path / "labelled")
    with pytest.raises(LabelConflictError, match=r"moved\.png \(blue\).*new_0\.png \(red\)|new_0\.png \(red\).*moved"):
        add_labelled(train, validation, labelled, tmp_path / "out", str(queue))
    assert not (tmp_path / "out").exists()


def test_a_class_the_training_data_lacks_is_one_line_naming_the_folder_and_the_classes(colour_image_dirs, queue):
    write_image(queue / "cow" / "1.png", (120, 120, 120))
    with pytest.raises(InvalidDatasetError) as told:
        check_labelled_folder(str(queue), {"red", "green", "blue"})
    assert str(told.value).startswith(
        f"{queue}: class folder cow not among the training data's classes (blue, green, red): move its images"
    )


def test_the_command_line_refuses_a_conflict_before_any_work(colour_image_dirs, queue, tmp_path):
    train, _ = colour_image_dirs
    shutil.copy(queue / "red" / "new_0.png", queue / "blue" / "moved.png")
    sources = ("--train-data", str(train.parent / "src-train"), "--validation-data", str(train.parent / "src-val"))
    argv = ["train", *sources, "--labelled-data", str(queue), "--registry", str(tmp_path / "r")]
    done = main_in_process(image_classifier, [*argv, "--work-dir", str(tmp_path / "w")])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: one image under two classes in the labelled data: ")
    assert not (tmp_path / "w").exists() and not (tmp_path / "r").exists()


def labelled_events(name: str) -> list[dict]:
    with get_client(sync_client=True) as client:
        response = client._client.post(
            "/events/filter",
            json={
                "filter": {"event": {"name": [LABELLED_EVENT]}, "resource": {"id": [f"image-classifier.model.{name}"]}},
                "limit": 5,
            },
        )
    return response.json()["events"]


def test_the_data_step_publishes_the_counts_and_announces_the_batch(prefect_server, colour_image_dirs, queue, tmp_path):
    train, _ = colour_image_dirs
    name = f"colours-{uuid4().hex[:8]}"

    @flow(name=TRAINING_FLOW)
    def data_step():
        return prepare_data(
            str(train.parent / "src-train"),
            str(train.parent / "src-val"),
            None,
            -1,
            ConversionLimits(),
            str(tmp_path / "runs"),
            tmp_path / "runs" / "r1",
            1,
            labelled_data=str(queue),
            model_name=name,
            architecture="resnet18",
        )

    state = data_step(return_state=True)
    train_dir, _ = state.result()
    assert ImageDirectory(train_dir).manifest.counts == {"blue": 10, "green": 8, "red": 9}
    artifacts, _ = asyncio.run(artifacts_and_task_runs(state.state_details.flow_run_id))
    (artifact,) = [a for a in artifacts if a.key == LABELLED_ARTIFACT_KEY]
    assert '"already in validation": 1' in artifact.data and "3 labelled images from" in artifact.description
    drain_prefect_workers()
    (event,) = wait_for(lambda: labelled_events(name), 60, interval=0.5, what="the labelled event")
    assert event["payload"]["added"] == {"blue": 2, "green": 0, "red": 1}
    assert event["payload"]["labelled_data"] == str(queue) and event["payload"]["model"] == name
    # The pipeline's own announcement never starts a training; one from elsewhere (a person, a labelling tool) does.
    trigger = labelled_automation("00000000-0000-0000-0000-000000000000", timedelta(hours=6)).trigger
    assert event["resource"]["image-classifier.emitted-by"] == TRAINING_FLOW
    assert not trigger.match.matches(model_name_resource(name, TRAINING_FLOW))
    assert trigger.match.matches(model_name_resource(name, "a person"))
    assert trigger.expect == {LABELLED_EVENT} and trigger.within == timedelta(hours=6)
    assert LABELLED_PARAMETERS["labelled_data"]["template"] == "{{ event.payload.labelled_data }}"
