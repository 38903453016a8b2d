"""Which backend a registry location needs: a folder (``LocalBackend``) or ``s3://bucket/prefix`` (``S3Backend``).
Both backends are imported here, and neither imports this: no import circle between them."""

from __future__ import annotations

import os

from tasks.registry.backends import LocalBackend, RegistryBackend
from tasks.registry.s3 import S3Backend
from tasks.storage.s3 import is_s3_uri


def open_backend(location: str | os.PathLike[str]) -> RegistryBackend:
    """The backend for a registry folder or ``s3://bucket/prefix``."""
    return S3Backend(str(location)) if is_s3_uri(location) else LocalBackend(location)
