"""Prefect flows: they compose the stages in tasks/ and hold no logic of their own."""

from pathlib import Path


def run_folder(work_dir: str, prefix: str = "") -> Path:
    """This flow run's folder under ``work_dir``, named after the run: a retried run finds its files again."""
    from prefect.runtime import flow_run

    return Path(work_dir).resolve() / f"{prefix}{flow_run.get_name()}-{flow_run.get_id()[:8]}"
