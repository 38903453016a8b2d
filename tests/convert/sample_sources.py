"""Small sources on disk for the conversion tests, and what they read back from a conversion."""

import io
import tarfile
from pathlib import Path

from tasks.contracts.image_directory import ImageDirectory
from tasks.storage.local_files import sha256_file
from tests.helpers import COLOURS, write_image


def snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def write_flat(folder: Path, names_and_colours: dict[str, str]) -> Path:
    for i, (name, colour) in enumerate(names_and_colours.items()):
        write_image(folder / name, COLOURS[colour], seed=i)
    return folder


def reasons_by_path(image_dir: ImageDirectory) -> dict[str, str]:
    return {q.path: q.reason for q in image_dir.manifest.quarantined}


def tar_bytes(source: Path, wrapper: str, mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        archive.add(source, arcname=wrapper)
    return buffer.getvalue()
