"""Where a run's folders live when ``work_dir`` is ``s3://bucket/prefix`` (plain paths pass through every function
unchanged): locations joined, and this host's copy of an S3 folder under its cache.

    <cache>/s3/<bucket>/<key>/          a local copy of an S3 folder (model spec, training output)

``<cache>`` is ``$IMAGE_CLASSIFIER_CACHE`` (default ``~/.cache/image-classifier``), one per host. What needs a
contract (an ImageDirectory stored once and fetched into the cache, a training's output kept in step with S3)
is tasks/work_dir/, above the contracts.
"""

from __future__ import annotations

import os
from pathlib import Path

from tasks.storage.s3 import download_files, is_s3_uri, list_s3_names, parse_s3_uri

CACHE_VARIABLE = "IMAGE_CLASSIFIER_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "image-classifier")


def join(location: str, *parts: str) -> str:
    """``location/part/...`` for a path or an S3 URI."""
    return "/".join([location.rstrip("/"), *parts]) if is_s3_uri(location) else str(Path(location, *parts))


def local_folder(location: str) -> Path:
    """Where this host keeps ``location``: the path itself, or its copy under the cache for an S3 URI."""
    if not is_s3_uri(location):
        return Path(location)
    where = parse_s3_uri(location)
    return cache_root() / "s3" / where.bucket / where.prefix


def files_below(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root).as_posix()) for p in root.rglob("*") if p.is_file())


def fetch_folder(location: str) -> Path:
    """A local copy of a small folder (a model spec): itself, or every object below the S3 URI downloaded."""
    if not is_s3_uri(location):
        return Path(location)
    local = local_folder(location)
    download_files(location, list_s3_names(location), local)
    return local
