"""Train PyTorch Model, the Prefect task: train through ``tasks.launch.torchrun_launcher.launch_training`` on this host, or on
``nodes`` hosts through the work pool (tasks/launch/multinode.py); the training-progress bar, the live training-curves
picture and the training-metrics table as artifacts."""

from __future__ import annotations

import tempfile
from pathlib import Path
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterTaskRunId, ArtifactFilterType
from prefect.runtime import task_run

from tasks.contracts.model_directory import TRAINING_CURVES_FILE, ModelDirectory, TrainingMetrics
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.evaluation.plots import plot_training_curves, png_markdown, significant
from tasks.launch.multinode import Rendezvous, run_nodes
from tasks.launch.torchrun_launcher import launch_training
from tasks.launch.torchrun_output import NewEpochs, read_metrics
from tasks.retrying import stage_task
from tasks.storage.work_dir_on_s3 import mirror_of


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
@stage_task("train", retries=1, retry_delay_seconds=5)
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
            log=logger.log,
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


@task(name="train-node", cache_policy=NO_CACHE)
def train_node(folders: TrainingFolders, params: TrainingParams, rendezvous: Rendezvous) -> str:
    """One node's launcher of a multi-node training (flows/train_node.py); not retried alone: the train task
    that submitted the nodes retries them all together."""
    node_params = params.model_copy(update={"rendezvous_endpoint": rendezvous.endpoint})
    model_dir = launch_training(
        folders,
        node_params,
        run_id=rendezvous.id,
        is_host=rendezvous.is_host,
        log=get_run_logger().log,
    )
    return str(model_dir.root)
