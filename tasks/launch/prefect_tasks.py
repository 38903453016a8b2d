"""The Prefect tasks of training: ``train`` (on this host through ``torchrun_launcher.launch_training``, or on
``nodes`` hosts through the work pool: ``prefect_nodes.run_nodes``); the training-progress bar, the live
training-curves picture and the training-metrics table as artifacts; and a run replacing a lost one taking over its
folder (``take_over_lost_run``, ``take_over_lost_trial``: the plain half in ``lost_runs.py``, the chain of runs and
the artifacts linking them in tasks/fanout/reruns.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterTaskRunId,
    ArtifactFilterType,
)
from prefect.runtime import task_run

from tasks.contracts.model_directory import TRAINING_CURVES_FILE, ModelDirectory, TrainingMetrics
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.evaluation.plots import plot_training_curves, significant
from tasks.fanout.reruns import announce_takeover, rerun_chain
from tasks.launch.lost_runs import Takeover, takeover_of
from tasks.launch.prefect_nodes import run_nodes
from tasks.launch.torchrun_launcher import launch_training
from tasks.launch.torchrun_output import NewEpochs, read_metrics, watchable
from tasks.markdown.pictures import png_markdown
from tasks.retrying import stage_task
from tasks.storage.runs import mark_run, run_folder_location
from tasks.storage.work_dir_on_s3 import join
from tasks.work_dir.training_output import mirror_of


def epochs_done(metrics: TrainingMetrics | None, total: int) -> str:
    done = 0 if metrics is None else (total if metrics.stopped_early else len(metrics.epochs))
    return f"{done} of {total} epochs" + (" (stopped early)" if metrics is not None and metrics.stopped_early else "")


def publish_training_curves(metrics: TrainingMetrics, path: Path, description: str) -> None:
    """Draw the curves to ``path`` and publish them as the next version of artifact ``training-curves``: one
    key, so the UI shows the latest picture, and its history is the training's."""
    plot_training_curves(metrics, path)
    create_markdown_artifact(
        key="training-curves",
        markdown=f"### Training curves\n\n{png_markdown(path, 'loss and accuracy by epoch')}\n",
        description=description,
    )


def progress_artifact(total_epochs: int) -> UUID:
    """This task run's ``training-progress`` artifact: created on the first attempt, carried on by a retry
    (a new one per attempt would leave the first stuck at the fraction it had reached)."""
    task_run_id = task_run.id
    if task_run_id is not None:
        with get_client(sync_client=True) as client:
            earlier = client.read_artifacts(
                artifact_filter=ArtifactFilter(
                    task_run_id=ArtifactFilterTaskRunId(any_=[task_run_id]), type=ArtifactFilterType(any_=["progress"])
                ),
                limit=1,
            )
        if earlier:
            return earlier[0].id
    return create_progress_artifact(0.0, key="training-progress", description=epochs_done(None, total_epochs))


# One retry: the worker resumes from its last checkpoint, so a retry costs at most one epoch.
@stage_task(retries=1, retry_delay_seconds=5)
def train(folders: TrainingFolders, params: TrainingParams) -> str:
    """Artifacts ``training-progress`` (live, "3 of 5 epochs"), ``training-curves`` (live too: a new version
    per epoch seen) and ``training-metrics``."""
    logger = get_run_logger()
    progress = progress_artifact(params.epochs)

    def on_metrics(metrics: TrainingMetrics) -> None:
        done = params.epochs if metrics.stopped_early else len(metrics.epochs)
        update_progress_artifact(
            progress, 100.0 * done / params.epochs, description=epochs_done(metrics, params.epochs)
        )
        if metrics.epochs:  # the curves so far, beside the progress bar; output_dir may be on S3: draw aside
            with tempfile.TemporaryDirectory(prefix="training-curves-") as scratch:
                publish_training_curves(
                    metrics, Path(scratch) / TRAINING_CURVES_FILE, f"so far: {epochs_done(metrics, params.epochs)}"
                )

    mirror = mirror_of(folders.output_dir)
    if params.max_nodes == 1:
        model_dir = launch_training(
            folders,
            params,
            run_id=Path(folders.output_dir).parent.name,
            log=watchable(logger.log),
            on_metrics=on_metrics,
        )
    else:
        # One flow run per node through the work pool (tasks/launch/multinode.py); they write into output_dir, watched here.
        read = mirror.remote_metrics if mirror else lambda: read_metrics(Path(folders.output_dir))
        run_nodes(folders, params, on_poll=NewEpochs(read, on_metrics).poll)
        # On S3: the stages after training read the model from this host's copy.
        model_dir = ModelDirectory(mirror.download_all() if mirror else folders.output_dir)
    metrics = model_dir.metrics()
    update_progress_artifact(progress, 100.0, description=epochs_done(metrics, params.epochs))
    curves = model_dir.root / TRAINING_CURVES_FILE
    summary = f"best top-1 {metrics.best_top1:.4g} at epoch {metrics.best_epoch} of {len(metrics.epochs)}" + (
        " (stopped early)" if metrics.stopped_early else ""
    )
    publish_training_curves(metrics, curves, summary)
    if mirror:
        mirror.upload(TRAINING_CURVES_FILE)
    create_table_artifact(
        key="training-metrics",
        table=[{name: significant(value) for name, value in epoch.model_dump().items()} for epoch in metrics.epochs],
        description=f"{summary}; curves in {curves.resolve()}",
    )
    return str(model_dir.root)


def take_over_lost_run(replaces_run: str, work_dir: str) -> Takeover:
    """Called first by a training run whose ``replaces_run`` is set (tasks/launch/lost_runs.py): its Takeover of
    the first run's folder under ``work_dir``, told in the first log line, artifact ``replaced-run`` here and
    ``replaced-by`` on the lost run."""
    chain = rerun_chain(replaces_run)
    first = chain[-1]
    run_dir = run_folder_location(work_dir, f"{first.name}-{first.id[:8]}")
    takeover = takeover_of(chain, run_dir, join(run_dir, "model"), f"work_dir {work_dir!r}")
    announce_takeover(takeover.replaced, takeover.headline(), takeover.markdown)
    mark_run(run_dir, "train", first.id)
    return takeover


def take_over_lost_trial(replaces_run: str, output_dir: str) -> Takeover:
    """The same for a sweep's trial run again by its sweep's fan-out: it trains into the lost run's ``output_dir``,
    in the trial's folder of the sweep's run folder, and resumes from its checkpoint there."""
    chain = rerun_chain(replaces_run)
    parent = output_dir.rstrip("/").rsplit("/", 1)[0]
    takeover = takeover_of(chain, parent, output_dir, "the sweep's work_dir")
    announce_takeover(takeover.replaced, takeover.headline(), takeover.markdown)
    return takeover
