"""Secrets kept in files only their owner may read (mode 0600), in ``${XDG_CONFIG_HOME:-~/.config}/image-classifier/``
(``IMAGE_CLASSIFIER_CONFIG`` names another folder): the Prefect server's auth string and database URL
(deployments/auth.py) and the online endpoint's bearer token (tasks/serving). One rule for all: a secret is needed
off loopback, a file that its group or others may read is refused in one line, and a missing one is created with a
random value. Standard library only."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path


class SecretFileError(Exception):
    """A secret's file that cannot be trusted or read: a user's mistake, told in one line."""


def config_dir() -> Path:
    configured = os.environ.get("IMAGE_CLASSIFIER_CONFIG")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "image-classifier"


def read_secret(path: Path) -> str | None:
    """The secret in ``path`` (None when there is no such file), refused unless only its owner may read it."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return None
    if status.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretFileError(
            f"{path} may be read by others (mode {stat.S_IMODE(status.st_mode):04o}): "
            f"run `chmod 600 {path}`, and change the secret in it if others could have read it"
        )
    text = path.read_text(encoding="utf-8").strip()
    if not text:
        raise SecretFileError(f"{path} is empty: write the secret in it, or remove it")
    return text


def create_secret(path: Path, secret: str) -> str:
    """Write ``secret`` to the new file ``path``, created with mode 0600 (never opened wider)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(secret + "\n")
    return secret


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
