"""A run that replaces lost ones, on a real (ephemeral) Prefect server: the lost runs are flow runs created through
the API and set Crashed as the zombie automation sets them; the replacing run is a flow calling
take_over_lost_run (tasks/launch/prefect_tasks.py; its chain and limit: tasks/fanout/reruns.py). (The whole path through two workers and S3 is tests/deployments/test_deployments.py's last
test.)"""

import json
import uuid
from pathlib import Path

import pytest
from prefect import flow
from prefect.states import Crashed

from tasks.contracts.model_directory import EpochMetrics, TrainingMetrics
from tasks.errors import RerunLimitError, UnknownRunError
from tasks.fanout.decisions import MAX_RERUNS
from tasks.launch.lost_runs import Takeover
from tasks.launch.prefect_tasks import take_over_lost_run, take_over_lost_trial

pytestmark = pytest.mark.integration


@flow(name="train-pipeline")
def replacing(replaces_run: str, work_dir: str) -> Takeover:
    return take_over_lost_run(replaces_run, work_dir)


@flow(name="sweep-trial")
def replacing_trial(replaces_run: str, output_dir: str) -> Takeover:
    return take_over_lost_trial(replaces_run, output_dir)


def lost_runs(count: int) -> list:
    """``count`` crashed runs of the training flow, each replacing the one before; the first is the training's."""
    from prefect.client.orchestration import get_client

    runs = []
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(replacing)
        for _ in range(count):
            parameters = {"work_dir": "runs", **({"replaces_run": str(runs[-1].id)} if runs else {})}
            run = client.create_flow_run(replacing, parameters=parameters, state=Crashed(message="No heartbeat."))
            assert run.flow_id == flow_id
            runs.append(run)
    return runs


def artifacts_of(run_id) -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    return {a.key: a.data for a in found}


def test_on_another_host_without_the_lost_runs_folder_it_starts_over_and_says_why(prefect_server, tmp_path):
    (lost,) = lost_runs(1)
    work_dir = tmp_path / "runs-of-this-host"
    takeover = replacing(str(lost.id), str(work_dir))

    assert takeover.training_run_id == str(lost.id) and takeover.epochs_stored is None
    assert takeover.run_dir == str(work_dir / f"{lost.name}-{str(lost.id)[:8]}")
    assert takeover.headline() == (
        f"Replaces run {lost.name} (Crashed: No heartbeat); re-run 1 of at most {MAX_RERUNS}; starting over: the "
        f"lost run's folder {takeover.run_dir} is not on this host (work_dir {str(work_dir)!r} was on the lost "
        "host's own disk; on S3 or a folder every host shares, a re-run resumes from the checkpoint)"
    )
    # It works in the training's folder, marked as that run's; the lost run's page links to the new run.
    marker = json.loads((Path(takeover.run_dir) / "run.json").read_text())
    assert marker["flow_run_id"] == str(lost.id)
    assert takeover.headline() in artifacts_of(lost.id)["replaced-by"]


def test_in_a_shared_folder_it_resumes_after_the_stored_epochs_of_the_first_runs_folder(prefect_server, tmp_path):
    first, second = lost_runs(2)
    folder = tmp_path / f"{first.name}-{str(first.id)[:8]}"
    figures = {"lr": 0.1, "train_images_per_s": 9.0, "train_loss": 1.0, "train_error": 0.5, "val_loss": 1.0}
    epoch = EpochMetrics(epoch=1, top1=0.5, top5=1.0, seconds=1.0, **figures)
    metrics = TrainingMetrics(world_size=1, epochs=[epoch, epoch.model_copy(update={"epoch": 2})])
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "metrics.json").write_text(metrics.model_dump_json())

    takeover = replacing(str(second.id), str(tmp_path))
    assert [run.id for run in takeover.lost] == [str(second.id), str(first.id)]
    assert (takeover.run_dir, takeover.epochs_stored, takeover.training_run_id) == (str(folder), 2, str(first.id))
    assert "re-run 2 of at most 2; resuming from its last checkpoint (epoch 2 or later) in" in takeover.headline()


def test_a_sweep_trial_run_again_resumes_in_its_own_folder_and_marks_no_run_folder(prefect_server, tmp_path):
    """A trial's folder is the sweep's (trials/trial-NNN/model): the takeover reads its epochs there and writes
    nothing of a training run's (no run.json)."""
    first, second = lost_runs(2)
    output_dir = tmp_path / "sweep-x" / "trials" / "trial-002" / "model"
    figures = {"lr": 0.1, "train_images_per_s": 9.0, "train_loss": 1.0, "train_error": 0.5, "val_loss": 1.0}
    metrics = TrainingMetrics(world_size=1, epochs=[EpochMetrics(epoch=1, top1=0.5, top5=1.0, seconds=1.0, **figures)])
    output_dir.mkdir(parents=True)
    (output_dir / "metrics.json").write_text(metrics.model_dump_json())

    takeover = replacing_trial(str(second.id), str(output_dir))
    assert (takeover.run_dir, takeover.epochs_stored) == (str(output_dir.parent), 1)
    assert "re-run 2 of at most 2; resuming from its last checkpoint (epoch 1 or later) in" in takeover.headline()
    assert sorted(p.name for p in output_dir.parent.iterdir()) == ["model"]
    assert takeover.headline() in artifacts_of(second.id)["replaced-by"]
    with pytest.raises(RerunLimitError, match="the limit is 2 re-runs"):
        replacing_trial(str(lost_runs(MAX_RERUNS + 1)[-1].id), str(output_dir))


def test_a_training_run_again_as_often_as_allowed_is_not_run_once_more(prefect_server, tmp_path):
    runs = lost_runs(MAX_RERUNS + 1)
    with pytest.raises(RerunLimitError, match=rf"already ran {MAX_RERUNS + 1} times and lost its host each time"):
        replacing(str(runs[-1].id), str(tmp_path))
    assert not any(tmp_path.iterdir()), "nothing was written"


def test_a_replaced_run_that_does_not_exist_is_one_clear_error(prefect_server, tmp_path):
    missing = str(uuid.uuid4())
    with pytest.raises(UnknownRunError, match=f"replaces_run {missing}: the Prefect server has no such flow run"):
        replacing(missing, str(tmp_path))
    with pytest.raises(UnknownRunError, match="replaces_run 'red-fennec': not a flow run id"):
        replacing("red-fennec", str(tmp_path))
