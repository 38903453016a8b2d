"""The train pipeline's flow: what it tells a person at its end, and a limit of its input reaching its stage on a
real (temporary) Prefect server. The whole pipeline runs end to end in tests/deployments/test_deployments.py (your
own photos through the team's server: one folder split, fetched weights, a killed torchrun worker, the promotion
approved in the UI) and tests/test_docs_commands.py (`make run` and the README's one-folder training, as pasted)."""

from datetime import datetime, timezone

import pytest

from flows.pipeline import PipelineResult, train_pipeline
from tasks.contracts.conversion_limits import ConversionLimits
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.registry_layout import Approval, Promotion, Registration
from tasks.errors import InvalidDatasetError, PipelineInputError
from tasks.evaluation.evaluate import Evaluation
from tests.helpers import write_class_folders


def pipeline_result(**changes) -> PipelineResult:
    """A registered digits model, approved and promoted to production, its run folder kept at 3 MB."""
    now = datetime.now(timezone.utc)
    approval = Approval(decision="approved", reviewer="ada", comment="looks right", answered_at=now)
    promotion = Promotion(
        alias="production",
        metric="f1_macro",
        challenger=0.89,
        champion_version=None,
        champion=None,
        promoted=True,
        awaiting_approval=True,
        approval=approval,
    )
    registration = Registration(
        name="digits-resnet18",
        version=1,
        created_at=now,
        metrics={"best_top1": 0.9, "best_epoch": 3, "epochs_trained": 4},
        params={},
        datasets={},
        files={},
        promotion=promotion,
    )
    evaluation = Evaluation(
        images=100,
        accuracy=0.9,
        precision_macro=0.91,
        recall_macro=0.9,
        f1_macro=0.89,
        precision_weighted=0.92,
        recall_weighted=0.9,
        f1_weighted=0.9,
        auc_ovr=0.99,
        classes=["0", "1"],
        macro_classes=["0", "1"],
        confusion_matrix=[[50, 5], [5, 40]],
        per_class=[],
    )
    fields = {
        "model_name": "digits-resnet18",
        "version": 1,
        "location": "registry/digits-resnet18/1",
        "run_dir": "runs/r1",
        "run_size_bytes": 3 * 2**20,
        "evaluation": evaluation,
        "registration": registration,
    }
    return PipelineResult(**(fields | changes))


def test_the_headline_and_the_summary_say_what_was_registered_how_it_scored_and_what_the_run_kept():
    result = pipeline_result()
    # The run's state message (what --watch and the UI show): one line.
    assert result.headline() == (
        "Registered digits-resnet18 version 1 in registry/digits-resnet18/1: top-1 0.9, F1 (macro) 0.89 on 100 "
        "validation images"
    )
    assert result.summary().splitlines() == [
        "Registered digits-resnet18 version 1 in registry/digits-resnet18/1",
        "  validation top-1 0.9000 (best epoch 3 of 4)",
        "  accuracy 0.9000, precision 0.9100, recall 0.9000, F1 0.8900, AUC 0.9900 (macro, 100 validation images)",
        "  run files (data, metrics, logs, scores; 3.0 MB): runs/r1",
        "  promoted to 'production' on f1_macro (0.8900 vs no champion); approved by ada: looks right",
    ]
    # keep="all" keeps the model too; an S3 run folder's size is not measured.
    kept_all = pipeline_result(keep="all", run_size_bytes=None, run_dir="s3://bucket/runs/r1")
    assert "  run files (data, model, logs, scores): s3://bucket/runs/r1" in kept_all.summary().splitlines()


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


def test_a_mistake_given_from_python_is_the_command_lines_one_line_error_before_any_work(prefect_server, tmp_path):
    """The flow checks its own arguments, by name, as the command line does (tests/flows/test_cli.py)."""
    (tmp_path / "train").mkdir()
    with pytest.raises(PipelineInputError) as told:
        train_pipeline(
            train_data=str(tmp_path / "train"),
            validation_data=str(tmp_path / "nope"),
            registry=str(tmp_path / "registry"),
            work_dir=str(tmp_path / "runs"),
        )
    said = str(told.value)
    assert said.startswith(f"the validation data '{tmp_path / 'nope'}' does not exist") and "\n" not in said
    assert not (tmp_path / "runs").exists() and not (tmp_path / "registry").exists(), "nothing written"
