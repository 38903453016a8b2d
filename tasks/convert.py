"""Convert to Image Directory: a folder or .zip of images becomes an ImageDirectory with a manifest.

A source is labeled when its images sit in one folder per class (``<source>/<class>/.../<image>``),
unlabeled when they sit directly in it. Wrapper folders (``archive/photos/<class>/...``) are skipped
down to the real base folder. Files that are not decodable images are quarantined, with the reason,
in the manifest; the source is only read, and nothing is written outside ``output``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import zipfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from PIL import Image

from tasks.errors import InvalidDatasetError
from tasks.fileio import sha256_file, staged_directory
from tasks.image_directory import (
    IMAGE_EXTENSIONS,
    MANIFEST_NAME,
    ImageDirectory,
    ImageDirectoryManifest,
    ImageRecord,
    QuarantinedFile,
)

IGNORED_NAMES = frozenset({"__MACOSX", "Thumbs.db", "desktop.ini"})


@dataclass(frozen=True)
class SourceFile:
    path: Path  # where it is now
    relative: PurePosixPath  # where it goes in the ImageDirectory
    label: str | None


def _visible(path: Path) -> bool:
    return not path.name.startswith(".") and path.name not in IGNORED_NAMES


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS


def _children(folder: Path) -> tuple[list[Path], list[Path]]:
    entries = sorted(p for p in folder.iterdir() if _visible(p))
    return [p for p in entries if p.is_dir()], [p for p in entries if _is_image(p)]


def find_base_folder(root: Path) -> Path:
    """Descend through folders that only wrap a single folder (``archive/photos/...``)."""
    while True:
        folders, images = _children(root)
        if len(folders) != 1 or images or _children(folders[0])[1]:
            return root
        root = folders[0]


def _images_under(folder: Path) -> Iterator[Path]:
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if _visible(Path(d)))
        for name in sorted(files):
            path = Path(current, name)
            if _visible(path) and _is_image(path):
                yield path


def plan_source(base: Path) -> tuple[bool, list[str], list[SourceFile], list[QuarantinedFile]]:
    """What a base folder holds: (labeled, classes, files to convert, files refused)."""
    folders, top_images = _children(base)
    if not folders:
        files = [SourceFile(p, PurePosixPath(p.name), None) for p in top_images]
        return False, [], files, []
    files: list[SourceFile] = []
    for folder in folders:
        for path in _images_under(folder):
            files.append(SourceFile(path, PurePosixPath(path.relative_to(base).as_posix()), folder.name))
    refused = [QuarantinedFile(path=p.name, reason="image outside any class folder") for p in top_images]
    classes = sorted({f.label for f in files})
    return True, classes, files, refused


def inspect_and_copy(file: SourceFile, destination_root: Path) -> ImageRecord | QuarantinedFile:
    """Decode the image fully (catches truncation and bombs), then copy its bytes unchanged."""
    try:
        with Image.open(file.path) as image:
            image.load()
            width, height, mode = image.width, image.height, image.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        return QuarantinedFile(path=file.relative.as_posix(), reason=f"not a readable image: {error}")
    target = destination_root / file.relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(file.path, target)
    return ImageRecord(
        path=file.relative.as_posix(),
        label=file.label,
        sha256=sha256_file(target),
        size_bytes=target.stat().st_size,
        width=width,
        height=height,
        mode=mode,
    )


@contextlib.contextmanager
def opened_source(source: Path) -> Iterator[Path]:
    """A folder to read the source from: the source itself, or a zip extracted to a temporary folder."""
    if source.is_dir():
        yield source
        return
    if source.is_file() and zipfile.is_zipfile(source):
        with tempfile.TemporaryDirectory(prefix="convert-") as scratch, zipfile.ZipFile(source) as archive:
            for member in archive.infolist():
                name = PurePosixPath(member.filename)
                if name.is_absolute() or ".." in name.parts:
                    raise InvalidDatasetError(f"{source}: refusing archive member {member.filename!r} outside the archive")
            archive.extractall(scratch)
            yield Path(scratch)
        return
    raise InvalidDatasetError(f"source {source} is neither a folder nor a .zip archive")


def _check_locations(source: Path, output: Path) -> None:
    if output.is_relative_to(source) or (source.is_dir() and source.is_relative_to(output)):
        raise InvalidDatasetError(f"output {output} and source {source} must not contain each other")
    if output.exists() and any(output.iterdir()) and not (output / MANIFEST_NAME).is_file():
        raise InvalidDatasetError(
            f"output {output} exists and is not an ImageDirectory: choose an empty or new folder"
        )


def convert_to_image_directory(
    source: str | os.PathLike[str], output: str | os.PathLike[str], *, threads: int | None = None
) -> ImageDirectory:
    """Convert a class-per-folder (or flat, unlabeled) folder or .zip into an ImageDirectory at ``output``.

    A previous ImageDirectory at ``output`` is replaced only once the new one is complete.
    """
    source, output = Path(source).resolve(), Path(output).resolve()
    if not source.exists():
        raise InvalidDatasetError(f"source {source} does not exist")
    _check_locations(source, output)
    with staged_directory(output) as staging:
        with opened_source(source) as unpacked:
            labeled, classes, files, refused = plan_source(find_base_folder(unpacked))
            # Decoding and hashing are I/O and C code that release the GIL: threads overlap them.
            with ThreadPoolExecutor(max_workers=threads or min(16, 2 * (os.cpu_count() or 1))) as pool:
                results = list(pool.map(lambda f: inspect_and_copy(f, staging), files))
        images = [r for r in results if isinstance(r, ImageRecord)]
        quarantined = refused + [r for r in results if isinstance(r, QuarantinedFile)]
        if not images:
            raise InvalidDatasetError(
                f"{source} holds no readable images (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}; "
                f"{len(quarantined)} files quarantined)"
            )
        counts = Counter(r.label for r in images) if labeled else Counter()
        manifest = ImageDirectoryManifest(
            labeled=labeled,
            classes=[c for c in classes if counts[c]],
            counts={c: counts[c] for c in classes if counts[c]},
            images=images,
            source=str(source),
            quarantined=quarantined,
        )
        ImageDirectory.write(staging, manifest)
    return ImageDirectory(output)


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.artifacts import create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from tasks.retrying import retry_unless_input_error  # noqa: E402


@task(name="convert", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE)
def convert(source: str, output: str, role: str) -> str:
    """Convert ``source`` for ``role`` ('train', 'validation', 'score'); artifact ``<role>-images``."""
    image_dir = convert_to_image_directory(source, output)
    manifest = image_dir.manifest
    rows = [{"class": c, "images": manifest.counts[c]} for c in manifest.classes] or [
        {"class": "(unlabeled)", "images": len(manifest.images)}
    ]
    create_table_artifact(
        key=f"{role}-images",
        table=rows,
        description=f"{role}: {len(manifest.images)} images in {len(manifest.classes)} classes from {manifest.source}; "
        f"{len(manifest.quarantined)} quarantined",
    )
    if manifest.quarantined:
        create_table_artifact(
            key=f"{role}-quarantined",
            table=[q.model_dump() for q in manifest.quarantined],
            description=f"{role}: files left out of the ImageDirectory, with the reason",
        )
    get_run_logger().info(
        "%s: %d images, %d classes, %d quarantined -> %s",
        role, len(manifest.images), len(manifest.classes), len(manifest.quarantined), image_dir.root,
    )  # fmt: skip
    return str(image_dir.root)
