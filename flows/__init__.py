"""Prefect flows: they compose the stages in tasks/ and hold no logic of their own."""

import os
from pathlib import Path

# Every entry point (python -m flows.pipeline / flows.score, the deployments) imports this package first: no usage
# reports from the Prefect server it may start, unless the user said otherwise.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from tasks.storage import is_s3_uri


def run_folder(work_dir: str, prefix: str = "") -> str:
    """This flow run's folder under ``work_dir`` (a path or s3://bucket/prefix), named after the run: a retried
    run finds its files again. A local one gets its ``run.json`` first (what ``runs prune`` recognises)."""
    from prefect.runtime import flow_run

    from tasks.runs import mark_run

    name = f"{prefix}{flow_run.get_name()}-{flow_run.get_id()[:8]}"
    folder = f"{work_dir.rstrip('/')}/{name}" if is_s3_uri(work_dir) else str(Path(work_dir).resolve() / name)
    mark_run(folder, prefix.rstrip("-") or "train", flow_run.get_id())
    return folder
