"""Which image is which class: class folders, a labels file, or no labels at all (data to score).

A base folder is labeled by class folders (``<base>/<class>/.../<image>``) or by a labels file: a CSV with
``image`` and ``label`` columns, or a JSON object ``{"<image>": "<label>"}``, naming images by their path
below the base folder (or by file name, where that is unique). A ``labels.csv`` or ``labels.json`` at the
top of the base folder is used without being asked for. The planning here works on a ``FolderListing``
(``tasks.convert.listing.list_folder``); nothing is decoded or written.

Hidden entries (a name starting with ".") are skipped and reported, except a hidden folder of images beside
other class folders: that is a class (``.net``). Class folder names equal once Unicode-normalised (NFC and
NFD spellings of ``café``) are one class, with a warning.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from tasks.convert.labels_file import read_labels_file
from tasks.convert.listing import FolderListing
from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.image_directory import IMAGE_EXTENSIONS, QuarantinedFile

LABELS_FILE_NAMES = ("labels.csv", "labels.json")
_SHOWN = 5  # names quoted in a message before "and N more"
# What a source holding one class folder is: one labeled class (training), or images to score.
SingleClass = Literal["labeled", "unlabeled"]


class SourceFile:
    """One file to convert. Held as strings, its paths made when asked: a conversion plans one per image, so
    each byte counts (a dataclass of three path objects took 700 bytes an image)."""

    __slots__ = ("_path", "_relative", "_original", "label")

    def __init__(
        self, path: Path | str, relative: PurePosixPath | str, original: PurePosixPath | str, label: str | None
    ) -> None:
        self._path, self._relative = os.fspath(path), str(relative)
        self._original = self._relative if str(original) == self._relative else str(original)
        self.label = label

    @property
    def path(self) -> Path:
        """Where it is now."""
        return Path(self._path)

    @property
    def relative(self) -> PurePosixPath:
        """Below the base folder: what a labels file names, and where it is stored."""
        return PurePosixPath(self._relative)

    @property
    def original(self) -> PurePosixPath:
        """Below the source: the user's own name for the file."""
        return PurePosixPath(self._original)

    def __repr__(self) -> str:
        return f"SourceFile({self._path!r}, {self._relative!r}, {self._original!r}, {self.label!r})"


@dataclass
class Plan:
    labeled: bool
    files: list[SourceFile]
    refused: list[QuarantinedFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def examples_of(items: list[str], *, quoted: bool = True) -> str:
    """The first few of ``items`` for a message, then "and N more"."""
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(repr(n) if quoted else n for n in items[:_SHOWN]) + more


def is_image_name(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in IMAGE_EXTENSIONS


def _hidden_parts(relative: PurePosixPath) -> list[int]:
    return [i for i, part in enumerate(relative.parts) if part.startswith(".")]


def find_base_folder(listing: FolderListing, single_class: SingleClass = "labeled") -> PurePosixPath:
    """Descend through folders that only wrap one folder (``export/photos/<class>/...``).

    Only images and labels files count as content: a README or LICENSE beside a wrapper does not stop the
    descent (``plan_source`` reports it). A folder stops the descent when it holds content or other than one
    visible folder, or when its only folder holds images itself: that folder is a class (a one-class data
    set) — unless ``single_class`` is "unlabeled", where it is a folder of images to score.
    """
    base = PurePosixPath()
    while True:
        at_base = [f for f in listing.files if f.parent == base]
        folders = [d for d in listing.folders if d.parent == base and not d.name.startswith(".")]
        if any(is_image_name(f.name) or f.name in LABELS_FILE_NAMES for f in at_base) or len(folders) != 1:
            return base
        if single_class == "labeled" and any(f.parent == folders[0] and is_image_name(f.name) for f in listing.files):
            return base
        base = folders[0]


def _source_file(root: Path, base: PurePosixPath, relative: PurePosixPath, label: str | None) -> SourceFile:
    return SourceFile(root / base / relative, relative, base / relative, label)


def _quarantine(base: PurePosixPath, relative: PurePosixPath, reason: str) -> QuarantinedFile:
    return QuarantinedFile(path=(base / relative).as_posix(), reason=reason)


def _plan_class_folders(root: Path, base: PurePosixPath, images: list[PurePosixPath], folders: list[str]) -> Plan:
    plan = Plan(labeled=True, files=[])
    spellings: dict[str, set[str]] = {}
    for relative in images:
        if len(relative.parts) == 1:
            plan.refused.append(_quarantine(base, relative, "image outside any class folder"))
        else:
            label = unicodedata.normalize("NFC", relative.parts[0])
            spellings.setdefault(label, set()).add(relative.parts[0])
            plan.files.append(_source_file(root, base, relative, label))
    empty = sorted(name for name in folders if name not in {i.parts[0] for i in images if len(i.parts) > 1})
    if empty:
        plan.warnings.append(f"class folders without images, left out: {examples_of(empty)}")
    for label, names in sorted(spellings.items()):
        if len(names) > 1:
            plan.warnings.append(
                f"class folders {' and '.join(ascii(n) for n in sorted(names))} differ only in Unicode "
                f"normalisation (NFC/NFD): merged into one class {label!r}"
            )
    return plan


def _plan_labels_file(
    root: Path, base: PurePosixPath, images: list[PurePosixPath], labels: dict[str, str], name: str
) -> Plan:
    by_name: dict[str, list[PurePosixPath]] = {}
    for relative in images:
        by_name.setdefault(relative.name, []).append(relative)
    plan, named, unnamed = Plan(labeled=True, files=[]), set(), []
    for relative in images:
        if relative.as_posix() in labels:
            key = relative.as_posix()
        elif relative.name in labels and len(by_name[relative.name]) == 1:
            key = relative.name
        else:
            plan.refused.append(_quarantine(base, relative, f"not named in the labels file {name}"))
            unnamed.append(relative.as_posix())
            continue
        named.add(key)
        if not labels[key]:
            plan.refused.append(_quarantine(base, relative, f"empty label in {name}"))
        else:
            plan.files.append(_source_file(root, base, relative, unicodedata.normalize("NFC", labels[key])))
    missing = sorted(set(labels) - named)
    if missing and len(missing) == len(labels):
        raise InvalidDatasetError(
            f"none of the {len(labels)} images named in the labels file {name} was found below "
            f"{(root / base).name or root / base} (e.g. {examples_of(missing)}); names are paths below the folder "
            "that holds the images, e.g. 'cat_1.jpg'"
        )
    if missing:
        plan.warnings.append(f"{len(missing)} images named in {name} are missing: {examples_of(missing)}")
    if unnamed:
        plan.warnings.append(f"{len(unnamed)} images are not in {name} and were left out: {examples_of(unnamed)}")
    return plan


def _skipped_hidden(base: PurePosixPath, files: list[PurePosixPath]) -> list[QuarantinedFile]:
    """One entry per hidden file, or per hidden folder with the count of files it holds."""
    entries: dict[PurePosixPath, int] = {}
    for relative in files:
        entry = PurePosixPath(*relative.parts[: _hidden_parts(relative)[0] + 1])
        entries[entry] = entries.get(entry, 0) + 1
    hidden_files = set(files)
    return [
        _quarantine(base, entry, "hidden file (its name starts with '.'): skipped")
        if entry in hidden_files
        else _quarantine(
            base,
            entry,
            f"hidden folder (its name starts with '.'), skipped with the {count} files in it: a hidden "
            "folder is read only as a class folder of images beside other class folders",
        )
        for entry, count in sorted(entries.items())
    ]


def plan_source(
    root: Path,
    listing: FolderListing,
    *,
    labels: tuple[dict[str, str], str] | None = None,
    labeled: bool | None = None,
    single_class: SingleClass = "labeled",
) -> tuple[Plan, str | None]:
    """The files of ``listing`` (below ``root``) to convert and how they are labeled; also the labels file used.

    ``labels`` is a labels table read from a file given by the user, with its name. ``labeled`` False
    takes every image unlabeled (for scoring); True requires labels. With ``labeled`` None, a source holding
    a single class folder is one labeled class, or, with ``single_class`` "unlabeled", images to score.
    """
    scoring = labeled is False or (labeled is None and single_class == "unlabeled")
    base = find_base_folder(listing, "unlabeled" if scoring else "labeled")
    files = [f.relative_to(base) for f in listing.files if f.is_relative_to(base)]
    visible_files = [f for f in files if not _hidden_parts(f)]
    labels_source = None
    if labels is None and labeled is not False:
        found = [n for n in LABELS_FILE_NAMES if PurePosixPath(n) in visible_files]
        if found:
            labels = (read_labels_file((root / base / found[0]).read_bytes(), found[0]), found[0])
            labels_source = found[0]
    images = [f for f in visible_files if is_image_name(f.name)]
    class_names = {unicodedata.normalize("NFC", i.parts[0]) for i in images if len(i.parts) > 1}
    by_class_folder = labeled is not False and labels is None and len(class_names) > (1 if scoring else 0)
    readable = visible_files
    if by_class_folder:  # a hidden folder of images beside other class folders is a class too (".net")
        hidden_classes = {
            f.parts[0] for f in files if _hidden_parts(f) == [0] and len(f.parts) > 1 and is_image_name(f.name)
        }
        readable = [
            f for f in files if not _hidden_parts(f) or f.parts[0] in hidden_classes and _hidden_parts(f) == [0]
        ]
        images = [f for f in readable if is_image_name(f.name)]
    if by_class_folder:
        folders = [d.name for d in listing.folders if d.parent == base and not d.name.startswith(".")]
        plan = _plan_class_folders(root, base, images, folders)
    elif labels is not None:
        plan = _plan_labels_file(root, base, images, *labels)
        labels_source = labels_source or labels[1]
    elif labeled is True:
        raise NotLabeledDatasetError(
            f"{root / base} holds images but neither class folders nor a labels file: put each class's images in "
            f"a folder named after the class, or add a labels.csv with 'image' and 'label' columns"
        )
    else:
        plan = Plan(labeled=False, files=[_source_file(root, base, i, None) for i in images])
    accepted = ", ".join(sorted(IMAGE_EXTENSIONS))
    plan.refused += [
        _quarantine(base, f, f"not an image type this stage reads ({accepted})")
        for f in readable
        if not is_image_name(f.name) and f.as_posix() != labels_source
    ]
    readable_set = set(readable)
    hidden = _skipped_hidden(base, [f for f in files if f not in readable_set])
    stray = [f for f in listing.files if not f.is_relative_to(base)]
    plan.refused += (
        hidden
        + listing.skipped
        + [
            QuarantinedFile(
                path=f.as_posix(),
                reason=f"beside the wrapper folders above {base.as_posix()!r}, "
                "the folder the images are read from: ignored",
            )
            for f in stray
        ]
    )
    if stray:
        plan.warnings.append(
            f"{len(stray)} files beside the wrapper folders above {base.as_posix()!r} were ignored: "
            f"{examples_of([f.as_posix() for f in stray])}"
        )
    if skipped := [q.path for q in hidden + listing.skipped]:
        plan.warnings.append(
            f"{len(skipped)} hidden entries, links or special files were skipped (reasons in the quarantined list): "
            f"{examples_of(skipped)}"
        )
    return plan, labels_source
