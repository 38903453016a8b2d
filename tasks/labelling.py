"""Which image is which class: class folders, a labels file, or no labels at all (data to score).

A base folder is labeled by class folders (``<base>/<class>/.../<image>``) or by a labels file: a CSV with
``image`` and ``label`` columns, or a JSON object ``{"<image>": "<label>"}``, naming images by their path
below the base folder (or by file name, where that is unique). A ``labels.csv`` or ``labels.json`` at the
top of the base folder is used without being asked for. The planning here only lists files; nothing is
decoded or written.
"""

from __future__ import annotations

import csv
import io
import json
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.image_directory import IMAGE_EXTENSIONS, QuarantinedFile
from tasks.sources import visible

LABELS_FILE_NAMES = ("labels.csv", "labels.json")
_SHOWN = 5  # names quoted in a message before "and N more"


@dataclass(frozen=True)
class SourceFile:
    path: Path  # where it is now
    relative: PurePosixPath  # below the base folder
    label: str | None


@dataclass
class Plan:
    labeled: bool
    files: list[SourceFile]
    refused: list[QuarantinedFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _some(names: list[str]) -> str:
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(repr(n) for n in names[:_SHOWN]) + more


def is_image_name(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in IMAGE_EXTENSIONS


def list_files(base: Path) -> list[PurePosixPath]:
    """Visible files below ``base`` (any depth), relative to it, sorted."""
    found = []
    for current, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if visible(PurePosixPath(d))]
        for name in files:
            relative = PurePosixPath(Path(current, name).relative_to(base).as_posix())
            if visible(relative) and Path(current, name).is_file():
                found.append(relative)
    return sorted(found)


def find_base_folder(root: Path) -> Path:
    """Descend through folders that only wrap one folder (``export/photos/<class>/...``).

    A folder stops the descent when it holds files (images or a labels file), or when its only sub-folder
    holds images itself: then that sub-folder is a class (a one-class data set), not a wrapper.
    """
    while True:
        entries = [p for p in root.iterdir() if visible(PurePosixPath(p.name))]
        folders = [p for p in entries if p.is_dir()]
        if len(folders) != 1 or any(p.is_file() for p in entries):
            return root
        if any(p.is_file() and is_image_name(p.name) and visible(PurePosixPath(p.name)) for p in folders[0].iterdir()):
            return root
        root = folders[0]


def read_labels_file(data: bytes, name: str) -> dict[str, str]:
    """Image name -> label from a CSV (``image``, ``label`` columns) or a JSON object."""
    text = data.decode("utf-8-sig")
    pairs: list[tuple[str, str]] = []
    if name.lower().endswith(".json"):
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidDatasetError(f"labels file {name} is not valid JSON: {error}") from error
        if not isinstance(mapping, dict) or not all(isinstance(v, (str, int)) for v in mapping.values()):
            raise InvalidDatasetError(f'labels file {name} must be one JSON object {{"<image>": "<label>", ...}}')
        pairs = [(str(k), str(v)) for k, v in mapping.items()]
    else:
        reader = csv.DictReader(io.StringIO(text))
        columns = {c.strip().lower(): c for c in reader.fieldnames or []}
        if not {"image", "label"} <= set(columns):
            raise InvalidDatasetError(
                f"labels file {name} has columns {reader.fieldnames}: it needs an 'image' and a 'label' column"
            )
        pairs = [((row[columns["image"]] or "").strip(), (row[columns["label"]] or "").strip()) for row in reader]
    labels: dict[str, str] = {}
    for image, label in pairs:
        image = image.replace("\\", "/").removeprefix("./")
        if not image:
            continue
        if labels.setdefault(image, label) != label:
            raise InvalidDatasetError(
                f"labels file {name} gives {image!r} two labels, {labels[image]!r} and {label!r}: keep one"
            )
    return labels


def _plan_class_folders(base: Path, images: list[PurePosixPath]) -> Plan:
    plan = Plan(labeled=True, files=[])
    for relative in images:
        if len(relative.parts) == 1:
            plan.refused.append(QuarantinedFile(path=relative.as_posix(), reason="image outside any class folder"))
        else:
            label = unicodedata.normalize("NFC", relative.parts[0])
            plan.files.append(SourceFile(base / relative, relative, label))
    with_images = {i.parts[0] for i in images if len(i.parts) > 1}
    empty = sorted(
        p.name for p in base.iterdir() if p.is_dir() and visible(PurePosixPath(p.name)) and p.name not in with_images
    )
    if empty:
        plan.warnings.append(f"class folders without images, left out: {_some(empty)}")
    return plan


def _plan_labels_file(base: Path, images: list[PurePosixPath], labels: dict[str, str], name: str) -> Plan:
    by_name: dict[str, list[PurePosixPath]] = {}
    for relative in images:
        by_name.setdefault(relative.name, []).append(relative)
    plan, named = Plan(labeled=True, files=[]), set()
    for relative in images:
        if relative.as_posix() in labels:
            key = relative.as_posix()
        elif relative.name in labels and len(by_name[relative.name]) == 1:
            key = relative.name
        else:
            plan.refused.append(
                QuarantinedFile(path=relative.as_posix(), reason=f"not named in the labels file {name}")
            )
            continue
        named.add(key)
        if not labels[key]:
            plan.refused.append(QuarantinedFile(path=relative.as_posix(), reason=f"empty label in {name}"))
        else:
            plan.files.append(SourceFile(base / relative, relative, unicodedata.normalize("NFC", labels[key])))
    missing = sorted(set(labels) - named)
    if missing and len(missing) == len(labels):
        raise InvalidDatasetError(
            f"none of the {len(labels)} images named in the labels file {name} was found below {base.name or base} "
            f"(e.g. {_some(missing)}); names are paths below the folder that holds the images, e.g. 'cat_1.jpg'"
        )
    if missing:
        plan.warnings.append(f"{len(missing)} images named in {name} are missing: {_some(missing)}")
    unnamed = [q.path for q in plan.refused if q.reason.startswith("not named")]
    if unnamed:
        plan.warnings.append(f"{len(unnamed)} images are not in {name} and were left out: {_some(unnamed)}")
    return plan


def plan_source(
    base: Path, *, labels: tuple[dict[str, str], str] | None = None, labeled: bool | None = None
) -> tuple[Plan, str | None]:
    """The files to convert below ``base`` and how they are labeled; also the labels file used, if any.

    ``labels`` is a labels table read from a file given by the user, with its name. ``labeled`` False
    takes every image unlabeled (for scoring); True requires labels.
    """
    files = list_files(base)
    labels_source = None
    if labels is None and labeled is not False:
        found = [n for n in LABELS_FILE_NAMES if PurePosixPath(n) in files]
        if found:
            labels = (read_labels_file((base / found[0]).read_bytes(), found[0]), found[0])
            labels_source = found[0]
    images = [f for f in files if is_image_name(f.name)]
    has_class_folders = any(len(i.parts) > 1 for i in images)
    if labeled is False or (labels is None and not has_class_folders):
        if labeled is True:
            raise NotLabeledDatasetError(
                f"{base} holds images but neither class folders nor a labels file: put each class's images in "
                f"a folder named after the class, or add a labels.csv with 'image' and 'label' columns"
            )
        plan = Plan(labeled=False, files=[SourceFile(base / i, i, None) for i in images])
    elif labels is not None:
        plan = _plan_labels_file(base, images, *labels)
        labels_source = labels_source or labels[1]
    else:
        plan = _plan_class_folders(base, images)
    accepted = ", ".join(sorted(IMAGE_EXTENSIONS))
    plan.refused += [
        QuarantinedFile(path=f.as_posix(), reason=f"not an image type this stage reads ({accepted})")
        for f in files
        if not is_image_name(f.name) and f.as_posix() != labels_source
    ]
    return plan, labels_source
