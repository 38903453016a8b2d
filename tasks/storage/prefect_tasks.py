"""The Prefect task of storage: ``keep_results`` (what a registered run's folder keeps), around ``runs``, which
imports no Prefect. ``store`` is tasks/work_dir/prefect_tasks.py's."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import get_run_logger

from tasks.retrying import stage_task
from tasks.storage.runs import Keep, drop_registered_copies, drop_unregistered_models, run_size


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
