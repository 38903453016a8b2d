"""The Prefect task of the work dir: ``store`` (a folder written on this host published where the next stages
read it), around ``images.publish``, which imports no Prefect."""

from __future__ import annotations

from tasks.retrying import stage_task
from tasks.work_dir.images import publish


@stage_task  # retries a storage fault, never a mistake in the location (InvalidStorageURIError)
def store(local: str, location: str) -> str:
    """``publish``: a folder written on this host, where the next stages (on any host) read it."""
    return publish(local, location)
