"""Prefect flows: they compose the stages in tasks/ and hold no logic of their own."""

import os

# Every entry point (python -m flows.pipeline / flows.score, the deployments) imports this package first: no usage
# reports from the Prefect server it may start, unless the user said otherwise.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The temporary server a command starts without PREFECT_API_URL: Prefect waits 20 s for it, far less than its start
# can take on a loaded small machine (BENCHMARKS.md). A start that still fails is one line (flows.cli.run_command).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def run_folder(work_dir: str, prefix: str = "") -> str:
    """This flow run's folder under ``work_dir`` (a path or s3://bucket/prefix), named after the run: a retried
    run finds its files again. A local one gets its ``run.json`` first (what ``runs prune`` recognises)."""
    from prefect.runtime import flow_run

    from tasks.storage.runs import mark_run, run_folder_location

    folder = run_folder_location(work_dir, f"{prefix}{flow_run.get_name()}-{flow_run.get_id()[:8]}")
    mark_run(folder, prefix.rstrip("-") or "train", flow_run.get_id())
    return folder
