"""Which image is which class: class folders, a labels file, or no labels at all (data to score).

A base folder is labeled by class folders (``<base>/<class>/.../<image>``) or by a labels file: a CSV with
``image`` and ``label`` columns, or a JSON object ``{"<image>": "<label>"}``, naming images by their path
below the base folder (or by file name, where that is unique). A ``labels.csv`` or ``labels.json`` at the
top of the base folder is used without being asked for. The planning here works on a ``FolderListing``
(``tasks.convert.listing.list_folder``); nothing is decoded or written.

Hidden entries (a name starting with ".") are skipped and reported, except a hidden folder of images beside
other class folders: that is a class (``.net``). Class folder names equal once Unicode-normalised (NFC and
NFD spellings of ``café``) are one class, with a warning.

A plan (``tasks.convert.plan``) holds no object per image: planning walks the listing once and keeps the counts,
the classes and what was refused; ``Plan.stored`` walks it again, giving each image to convert with the path it
is stored at.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path, PurePosixPath
from typing import Literal

from tasks.contracts.image_directory import IMAGE_EXTENSIONS, QuarantinedFile
from tasks.convert.labels_file import read_labels_file
from tasks.convert.listing import FolderListing
from tasks.convert.plan import (
    HIDDEN,
    NOT_IMAGE,
    REFUSE,
    TAKE,
    Examples,
    LabellingRules,
    Plan,
    examples_of,
    hidden_parts,
    is_image_name,
)
from tasks.errors import InvalidDatasetError, NotLabeledDatasetError

LABELS_FILE_NAMES = ("labels.csv", "labels.json")
# What a source holding one class folder is: one labeled class (training), or images to score.
SingleClass = Literal["labeled", "unlabeled"]


def find_base_folder(listing: FolderListing, single_class: SingleClass = "labeled") -> PurePosixPath:
    """Descend through folders that only wrap one folder (``export/photos/<class>/...``).

    Only images and labels files count as content: a README or LICENSE beside a wrapper does not stop the
    descent (``plan_source`` reports it). A folder stops the descent when it holds content or other than one
    visible folder, or when its only folder holds images itself: that folder is a class (a one-class data
    set) — unless ``single_class`` is "unlabeled", where it is a folder of images to score.
    """
    base = PurePosixPath()
    while True:
        here = listing.folders[base]
        folders = [name for name in here.subfolders if not name.startswith(".")]
        if any(is_image_name(n) or n in LABELS_FILE_NAMES for n in here.names) or len(folders) != 1:
            return base
        if single_class == "labeled" and any(is_image_name(n) for n in listing.folders[base / folders[0]].names):
            return base
        base = base / folders[0]


def _quarantine(base: PurePosixPath, relative: PurePosixPath | str, reason: str) -> QuarantinedFile:
    return QuarantinedFile(path=(base / relative).as_posix(), reason=reason)


def _survey(listing: FolderListing, base: PurePosixPath) -> tuple[set[str], set[str], list[str]]:
    """From the folders below ``base`` alone: the class names of visible folders holding visible images (NFC),
    the hidden top folders holding such images (``hidden_parts == [0]``), and the visible top folders."""
    class_names, hidden_classes = set(), set()
    for relative, folder in listing.folders.items():
        if not relative.is_relative_to(base) or relative == base:
            continue
        parts = relative.relative_to(base).parts
        hidden = hidden_parts(parts)
        if hidden not in ([], [0]) or not any(is_image_name(n) and not n.startswith(".") for n in folder.names):
            continue
        if hidden:
            hidden_classes.add(parts[0])
        else:
            class_names.add(unicodedata.normalize("NFC", parts[0]))
    top = [name for name in listing.folders[base].subfolders if not name.startswith(".")]
    return class_names, hidden_classes, top


def _count_named(listing: FolderListing, rules: LabellingRules) -> None:
    """How many readable images have each name a labels file names (a name alone picks an image only when unique)."""
    for folder, name in listing.walk(rules.base):
        if name is not None and name in (rules.labels or {}) and is_image_name(name) and not name.startswith("."):
            if rules.place(folder).readable:
                rules.name_counts[name] += 1


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
    labels_source = None
    if labels is None and labeled is not False:
        found = [n for n in LABELS_FILE_NAMES if n in listing.folders[base].names]
        if found:
            labels = (read_labels_file((root / base / found[0]).read_bytes(), found[0]), found[0])
            labels_source = found[0]
    class_names, hidden_classes, top_folders = _survey(listing, base)
    by_class_folder = labeled is not False and labels is None and len(class_names) > (1 if scoring else 0)
    if by_class_folder:  # a hidden folder of images beside other class folders is a class too (".net")
        rules = LabellingRules("classes", base, hidden_classes=hidden_classes)
    elif labels is not None:
        labels_source = labels_source or labels[1]
        rules = LabellingRules("labels", base, labels=labels[0], labels_name=labels[1])
        _count_named(listing, rules)
    elif labeled is True:
        raise NotLabeledDatasetError(
            f"{root / base} holds images but neither class folders nor a labels file: put each class's images in "
            f"a folder named after the class, or add a labels.csv with 'image' and 'label' columns"
        )
    else:
        rules = LabellingRules("unlabeled", base)
    rules.labels_source = labels_source
    plan = Plan(labeled=rules.mode != "unlabeled", root=root, listing=listing, rules=rules)
    _plan(plan, top_folders)
    return plan, labels_source


def _plan(plan: Plan, top_folders: list[str]) -> None:
    """Walk the listing once: the counts, classes, refusals and warnings of ``plan``."""
    rules, base, accepted = plan.rules, plan.rules.base, ", ".join(sorted(IMAGE_EXTENSIONS))
    refused, not_images = [], []
    stray_files: list[QuarantinedFile] = []
    hidden: dict[PurePosixPath, int] = {}
    hidden_files: set[PurePosixPath] = set()
    classes: set[str] = set()
    spellings: dict[str, set[str]] = {}
    named, unnamed = set(), Examples()
    stored_by: dict[tuple, PurePosixPath] = {}
    for folder, name in plan.listing.walk():
        if name is None:
            continue
        if not folder.relative.is_relative_to(base):
            stray_files.append(
                QuarantinedFile(
                    path=(folder.relative / name).as_posix(),
                    reason=f"beside the wrapper folders above {base.as_posix()!r}, "
                    "the folder the images are read from: ignored",
                )
            )
            continue
        place = rules.place(folder)
        what, detail = rules.decide(place, name)
        relative = f"{place.relative}/{name}" if place.relative else name
        if what == TAKE:
            label, key = detail
            plan.count += 1
            if label is not None:
                classes.add(label)
            key_stored = (label, "/".join(place.stored_parts).casefold())
            if stored_by.setdefault(key_stored, folder.relative) != folder.relative:
                plan.shared.add(key_stored)
            if rules.mode == "classes":
                spellings.setdefault(label, set()).add(place.parts[0])
            elif key is not None:
                named.add(key)
        elif what == REFUSE:
            refused.append(_quarantine(base, relative, detail))
            if rules.mode == "labels" and detail.startswith("not named"):
                unnamed.add(relative)
        elif what == NOT_IMAGE:
            not_images.append(_quarantine(base, relative, f"not an image type this stage reads ({accepted})"))
        elif what == HIDDEN:
            entry, is_file = detail
            hidden[entry] = hidden.get(entry, 0) + 1
            if is_file:
                hidden_files.add(entry)
    plan.classes = sorted(classes)
    if rules.mode == "classes":
        with_images = {parts for spelt in spellings.values() for parts in spelt}
        if empty := sorted(name for name in top_folders if name not in with_images):
            plan.warnings.append(f"class folders without images, left out: {examples_of(empty)}")
        for label, names in sorted(spellings.items()):
            if len(names) > 1:
                plan.warnings.append(
                    f"class folders {' and '.join(ascii(n) for n in sorted(names))} differ only in Unicode "
                    f"normalisation (NFC/NFD): merged into one class {label!r}"
                )
    elif rules.mode == "labels":
        _check_named(plan, named, unnamed)
    skipped_hidden = [
        _quarantine(base, entry, "hidden file (its name starts with '.'): skipped")
        if entry in hidden_files
        else _quarantine(
            base,
            entry,
            f"hidden folder (its name starts with '.'), skipped with the {count} files in it: a hidden "
            "folder is read only as a class folder of images beside other class folders",
        )
        for entry, count in sorted(hidden.items())
    ]
    plan.refused = refused + not_images + skipped_hidden + plan.listing.skipped + stray_files
    if stray_files:
        plan.warnings.append(
            f"{len(stray_files)} files beside the wrapper folders above {base.as_posix()!r} were ignored: "
            f"{examples_of([q.path for q in stray_files])}"
        )
    if skipped := [q.path for q in skipped_hidden + plan.listing.skipped]:
        plan.warnings.append(
            f"{len(skipped)} hidden entries, links or special files were skipped (reasons in the quarantined list): "
            f"{examples_of(skipped)}"
        )


def _check_named(plan: Plan, named: set[str], unnamed: Examples) -> None:
    rules = plan.rules
    labels, name = rules.labels or {}, rules.labels_name
    missing = sorted(set(labels) - named)
    if missing and len(missing) == len(labels):
        folder = plan.root / rules.base
        raise InvalidDatasetError(
            f"none of the {len(labels)} images named in the labels file {name} was found below "
            f"{folder.name or folder} (e.g. {examples_of(missing)}); names are paths below the folder "
            "that holds the images, e.g. 'cat_1.jpg'"
        )
    if missing:
        plan.warnings.append(f"{len(missing)} images named in {name} are missing: {examples_of(missing)}")
    if unnamed:
        plan.warnings.append(f"{len(unnamed)} images are not in {name} and were left out: {unnamed.text()}")
