"""The Prefect tasks of storage: ``store`` (a folder written on this host published where the next stages read
it) and ``keep_results`` (what a registered run's folder keeps), around ``work_dir_on_s3`` and ``runs``, which
import no Prefect."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import get_run_logger

from tasks.retrying import stage_task
from tasks.storage.runs import Keep, drop_registered_copies, drop_unregistered_models, run_size
from tasks.storage.work_dir_on_s3 import publish


@stage_task  # retries a storage fault, never a mistake in the location (InvalidStorageURIError)
def store(local: str, location: str) -> str:
    """``publish``: a folder written on this host, where the next stages (on any host) read it."""
    return publish(local, location)


@stage_task(retries=0)
def keep_results(
    run_dir: str, model_dir: str, keep: Keep, registered: dict, unregistered: Sequence[str] = ()
) -> int | None:
    """After registration, under ``keep="results"``: the run's copies of the registered model, its checkpoints and
    the staged pretrained weights go (``drop_registered_copies``), and so do those of the ``unregistered`` model
    folders (a sweep's other trials: ``drop_unregistered_models``). Returns the run folder's size afterwards, in
    bytes (None on S3)."""
    freed = drop_registered_copies(run_dir, model_dir, registered, keep)
    others = drop_unregistered_models(unregistered, keep)
    if freed or others:
        get_run_logger().info(
            "keep=results: %.1f MB of model files, checkpoints and staged weights dropped from %s (the registry "
            "holds the model%s)",
            (freed + others) / 2**20,
            run_dir,
            f"; {len(unregistered)} other trials keep their figures" if unregistered else "",
        )
    return run_size(run_dir)
