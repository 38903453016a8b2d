"""Which image is which class: class folders, a labels file, or no labels at all (data to score).

A base folder is labeled by class folders (``<base>/<class>/.../<image>``) or by a labels file: a CSV with
``image`` and ``label`` columns, or a JSON object ``{"<image>": "<label>"}``, naming images by their path
below the base folder (or by file name, where that is unique). A ``labels.csv`` or ``labels.json`` at the
top of the base folder is used without being asked for. The planning here works on a ``FolderListing``
(``tasks.convert.listing.list_folder``); nothing is decoded or written.

Hidden entries (a name starting with ".") are skipped and reported, except a hidden folder of images beside
other class folders: that is a class (``.net``). Class folder names equal once Unicode-normalised (NFC and
NFD spellings of ``café``) are one class, with a warning.

A plan holds no object per image: planning walks the listing once and keeps the counts, the classes and what
was refused; ``Plan.stored`` walks it again, giving each image to convert with the path it is stored at.
"""

from __future__ import annotations

import os
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

import numpy as np

from tasks.convert.labels_file import read_labels_file
from tasks.convert.listing import Folder, FolderListing
from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.image_directory import IMAGE_EXTENSIONS, QuarantinedFile, safe_name

LABELS_FILE_NAMES = ("labels.csv", "labels.json")
_SHOWN = 5  # names quoted in a message before "and N more"
# What a source holding one class folder is: one labeled class (training), or images to score.
SingleClass = Literal["labeled", "unlabeled"]


class SourceFile:
    """One file to convert. Held as strings, its paths made when asked: a conversion has a window of them at a
    time, so each byte counts (a dataclass of three path objects took 700 bytes an image)."""

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

    def size(self) -> int:
        return os.stat(self._path).st_size

    def __repr__(self) -> str:
        return f"SourceFile({self._path!r}, {self._relative!r}, {self._original!r}, {self.label!r})"


class Examples:
    """A count of things and the first few of them, for a message: "'a', 'b' and 998 more"."""

    def __init__(self) -> None:
        self.count, self.first = 0, []

    def add(self, item: str) -> None:
        self.count += 1
        if len(self.first) < _SHOWN:
            self.first.append(item)

    def __len__(self) -> int:
        return self.count

    def text(self, *, quoted: bool = True) -> str:
        more = f" and {self.count - _SHOWN} more" if self.count > _SHOWN else ""
        return ", ".join(repr(n) if quoted else n for n in self.first) + more


def examples_of(items: list[str], *, quoted: bool = True) -> str:
    """The first few of ``items`` for a message, then "and N more"."""
    examples = Examples()
    examples.count, examples.first = len(items), items[:_SHOWN]
    return examples.text(quoted=quoted)


def is_image_name(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _hidden_parts(parts: tuple[str, ...]) -> list[int]:
    return [i for i, part in enumerate(parts) if part.startswith(".")]


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


# What becomes of a file below the base folder.
_TAKE, _REFUSE, _NOT_IMAGE, _HIDDEN, _LABELS_FILE = range(5)
_Mode = Literal["classes", "labels", "unlabeled"]


@dataclass
class _Place:
    """What a folder below the base folder is to the plan."""

    relative: str  # below the base folder, POSIX ("" for the base folder itself)
    parts: tuple[str, ...]
    readable: bool  # its files are read (hidden ones aside)
    hidden_entry: PurePosixPath | None  # where a skipped file of it is reported: None, as the file itself
    label: str | None = None  # by class folder
    stored_parts: tuple[str, ...] = ()  # the folders its images are stored under, made safe


@dataclass
class _Rules:
    """How each file below the base folder is planned: by class folder, by a labels file, or unlabeled."""

    mode: _Mode
    base: PurePosixPath
    hidden_classes: set[str] = field(default_factory=set)
    labels: dict[str, str] | None = None
    labels_name: str | None = None
    labels_source: str | None = None
    name_counts: Counter[str] = field(default_factory=Counter)  # of images' names a labels file names
    _last: tuple[PurePosixPath, _Place] | None = None  # a walk stays in one folder a while: one is kept

    def place(self, folder: Folder) -> _Place:
        """``folder`` (below the base folder) as the plan sees it."""
        if self._last is not None and self._last[0] == folder.relative:
            return self._last[1]
        parts = folder.relative.relative_to(self.base).parts
        hidden = _hidden_parts(parts)
        if self.mode == "classes" and hidden == [0] and parts[0] in self.hidden_classes:
            place = _Place("/".join(parts), parts, True, PurePosixPath(parts[0]))
        elif hidden:
            place = _Place("/".join(parts), parts, False, PurePosixPath(*parts[: hidden[0] + 1]))
        else:
            place = _Place("/".join(parts), parts, True, None)
        if self.mode == "classes" and parts:
            place.label = unicodedata.normalize("NFC", parts[0])
        stored = parts[1:] if self.mode == "classes" else parts
        place.stored_parts = tuple(safe_name(p) for p in stored)
        self._last = (folder.relative, place)
        return place

    def decide(self, place: _Place, name: str) -> tuple[int, object]:
        """(what, detail): _TAKE (label, labels file key), _REFUSE (reason), _NOT_IMAGE, _HIDDEN (entry, whether
        the entry is the file itself), _LABELS_FILE."""
        relative = f"{place.relative}/{name}" if place.relative else name
        if not place.readable:
            return _HIDDEN, (place.hidden_entry, False)
        if name.startswith("."):
            entry = place.hidden_entry
            return _HIDDEN, (entry, False) if entry is not None else (PurePosixPath(relative), True)
        if not is_image_name(name):
            return (_LABELS_FILE, None) if relative == self.labels_source else (_NOT_IMAGE, None)
        if self.mode == "unlabeled":
            return _TAKE, (None, None)
        if self.mode == "classes":
            return (_TAKE, (place.label, None)) if place.parts else (_REFUSE, "image outside any class folder")
        labels = self.labels or {}
        if relative in labels:
            key = relative
        elif name in labels and self.name_counts[name] == 1:
            key = name
        else:
            return _REFUSE, f"not named in the labels file {self.labels_name}"
        if not labels[key]:
            return _REFUSE, f"empty label in {self.labels_name}"
        return _TAKE, (unicodedata.normalize("NFC", labels[key]), key)


@dataclass
class Plan:
    """The images to convert (walked by ``files`` and ``stored``, never held), and what planning found."""

    labeled: bool
    root: Path
    listing: FolderListing
    rules: _Rules
    classes: list[str] = field(default_factory=list)  # the planned images' labels, sorted
    count: int = 0  # images planned
    shared: set[tuple] = field(default_factory=set)  # stored folders that images of several folders go to
    refused: list[QuarantinedFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    renamed: Examples = field(default_factory=Examples)  # by the last ``stored`` walk

    def _taken(self) -> Iterator[tuple[_Place | None, Folder, str | None, str | None]]:
        """(place, folder, name, label) of each planned image; (place, folder, None, None) at each folder's end."""
        base = self.rules.base
        for folder, name in self.listing.walk(base):
            place = self.rules.place(folder)
            if name is None:
                yield place, folder, None, None
                continue
            what, detail = self.rules.decide(place, name)
            if what == _TAKE:
                yield place, folder, name, detail[0]

    def _source_file(self, place: _Place, folder: Folder, name: str, label: str | None) -> SourceFile:
        original = f"{folder.relative.as_posix()}/{name}" if folder.relative.parts else name
        relative = f"{place.relative}/{name}" if place.relative else name
        return SourceFile(os.path.join(self.root, original), relative, original, label)

    def files(self) -> Iterator[SourceFile]:
        """The images to convert, in path order."""
        for place, folder, name, label in self._taken():
            if name is not None:
                yield self._source_file(place, folder, name, label)

    def stored(self, folders: dict[str, str]) -> Iterator[tuple[SourceFile, str]]:
        """Each image to convert, in path order, with where it goes (a POSIX path): below its class's folder
        (``folders``), every component made safe (``safe_name``).

        Paths equal once made safe, or equal but for letter case or Unicode normalisation (``café`` spelt NFC and
        NFD in two merged class folders), get ``~2``, ``~3`` before the extension: none overwrites another; each
        renamed file is counted in ``renamed``. Only the names of the folders being walked are held (and of
        stored folders that several source folders go to)."""
        self.renamed = Examples()
        taken: dict[tuple, set[str]] = {}
        opened: dict[int, tuple[set[int], list[tuple]]] = {}  # by folder: names that may collide, sets it opened
        for place, folder, name, label in self._taken():
            if name is None:
                for key in opened.pop(id(folder), (None, ()))[1]:
                    if key not in self.shared:
                        del taken[key]
                continue
            if (here := opened.get(id(folder))) is None:
                here = opened[id(folder)] = (_colliding(folder), [])
            key = (label, "/".join(place.stored_parts).casefold())
            if (names := taken.get(key)) is None:
                names = taken[key] = set()
                here[1].append(key)
            prefix = (folders[label],) if label is not None else ()
            stored_name, n = safe_name(name), 1
            candidate = stored_name
            while candidate.casefold() in names:
                n += 1
                path = PurePosixPath(stored_name)
                candidate = f"{path.stem}~{n}{path.suffix}"
            # Held: what a later name could equal (one that recurs here once made safe, one with a "~" as renamed
            # names have), or every name of a stored folder that other source folders go to as well.
            if (
                candidate != stored_name
                or key in self.shared
                or "~" in candidate
                or hash(candidate.casefold()) in here[0]
            ):
                names.add(candidate.casefold())
            target = "/".join((*prefix, *place.stored_parts, candidate))
            file = self._source_file(place, folder, name, label)
            if candidate != stored_name:
                self.renamed.add(f"{file.original.as_posix()!r} -> {target!r}")
            yield file, target


def _colliding(folder: Folder) -> set[int]:
    """The hashes of the names (made safe, case-folded) that more than one of ``folder``'s files have: 8 bytes a
    file while it is worked out, rather than a set of every name."""
    keys = np.fromiter((hash(safe_name(n).casefold()) for n in folder.iter_names()), np.int64, folder.count)
    values, counts = np.unique(keys, return_counts=True)
    return set(values[counts > 1].tolist())


def _quarantine(base: PurePosixPath, relative: PurePosixPath | str, reason: str) -> QuarantinedFile:
    return QuarantinedFile(path=(base / relative).as_posix(), reason=reason)


def _survey(listing: FolderListing, base: PurePosixPath) -> tuple[set[str], set[str], list[str]]:
    """From the folders below ``base`` alone: the class names of visible folders holding visible images (NFC),
    the hidden top folders holding such images (``_hidden_parts == [0]``), and the visible top folders."""
    class_names, hidden_classes = set(), set()
    for relative, folder in listing.folders.items():
        if not relative.is_relative_to(base) or relative == base:
            continue
        parts = relative.relative_to(base).parts
        hidden = _hidden_parts(parts)
        if hidden not in ([], [0]) or not any(is_image_name(n) and not n.startswith(".") for n in folder.names):
            continue
        if hidden:
            hidden_classes.add(parts[0])
        else:
            class_names.add(unicodedata.normalize("NFC", parts[0]))
    top = [name for name in listing.folders[base].subfolders if not name.startswith(".")]
    return class_names, hidden_classes, top


def _count_named(listing: FolderListing, rules: _Rules) -> None:
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
        rules = _Rules("classes", base, hidden_classes=hidden_classes)
    elif labels is not None:
        labels_source = labels_source or labels[1]
        rules = _Rules("labels", base, labels=labels[0], labels_name=labels[1])
        _count_named(listing, rules)
    elif labeled is True:
        raise NotLabeledDatasetError(
            f"{root / base} holds images but neither class folders nor a labels file: put each class's images in "
            f"a folder named after the class, or add a labels.csv with 'image' and 'label' columns"
        )
    else:
        rules = _Rules("unlabeled", base)
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
        if what == _TAKE:
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
        elif what == _REFUSE:
            refused.append(_quarantine(base, relative, detail))
            if rules.mode == "labels" and detail.startswith("not named"):
                unnamed.add(relative)
        elif what == _NOT_IMAGE:
            not_images.append(_quarantine(base, relative, f"not an image type this stage reads ({accepted})"))
        elif what == _HIDDEN:
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
