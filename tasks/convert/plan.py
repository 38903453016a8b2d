"""What a conversion will store, walked rather than held: each file below the base folder judged by the rules
of its labelling (class folders, a labels file, or none: ``LabellingRules``), and the ``Plan`` that
``labelling.plan_source`` fills. A plan holds no object per image: ``Plan.files`` and ``Plan.stored`` walk the
listing again, giving each image to convert (a ``SourceFile``) with the path it is stored at."""

from __future__ import annotations

import os
import unicodedata
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

import numpy as np

from tasks.contracts.image_directory import IMAGE_EXTENSIONS, QuarantinedFile, safe_name, stored_file_name
from tasks.convert.listing import Folder, FolderListing

_SHOWN = 5  # names quoted in a message before "and N more"


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


def hidden_parts(parts: tuple[str, ...]) -> list[int]:
    return [i for i, part in enumerate(parts) if part.startswith(".")]


# What becomes of a file below the base folder.
TAKE, REFUSE, NOT_IMAGE, HIDDEN, LABELS_FILE = range(5)
_Mode = Literal["classes", "labels", "unlabeled"]


@dataclass
class Place:
    """What a folder below the base folder is to the plan."""

    relative: str  # below the base folder, POSIX ("" for the base folder itself)
    parts: tuple[str, ...]
    readable: bool  # its files are read (hidden ones aside)
    hidden_entry: PurePosixPath | None  # where a skipped file of it is reported: None, as the file itself
    label: str | None = None  # by class folder
    stored_parts: tuple[str, ...] = ()  # the folders its images are stored under, made safe


@dataclass
class LabellingRules:
    """How each file below the base folder is planned: by class folder, by a labels file, or unlabeled."""

    mode: _Mode
    base: PurePosixPath
    hidden_classes: set[str] = field(default_factory=set)
    labels: dict[str, str] | None = None
    labels_name: str | None = None
    labels_source: str | None = None
    name_counts: Counter[str] = field(default_factory=Counter)  # of images' names a labels file names
    _last: tuple[PurePosixPath, Place] | None = None  # a walk stays in one folder a while: one is kept

    def place(self, folder: Folder) -> Place:
        """``folder`` (below the base folder) as the plan sees it."""
        if self._last is not None and self._last[0] == folder.relative:
            return self._last[1]
        parts = folder.relative.relative_to(self.base).parts
        hidden = hidden_parts(parts)
        if self.mode == "classes" and hidden == [0] and parts[0] in self.hidden_classes:
            place = Place("/".join(parts), parts, True, PurePosixPath(parts[0]))
        elif hidden:
            place = Place("/".join(parts), parts, False, PurePosixPath(*parts[: hidden[0] + 1]))
        else:
            place = Place("/".join(parts), parts, True, None)
        if self.mode == "classes" and parts:
            place.label = unicodedata.normalize("NFC", parts[0])
        stored = parts[1:] if self.mode == "classes" else parts
        place.stored_parts = tuple(safe_name(p) for p in stored)
        self._last = (folder.relative, place)
        return place

    def decide(self, place: Place, name: str) -> tuple[int, object]:
        """(what, detail): TAKE (label, labels file key), REFUSE (reason), NOT_IMAGE, HIDDEN (entry, whether
        the entry is the file itself), LABELS_FILE."""
        relative = f"{place.relative}/{name}" if place.relative else name
        if not place.readable:
            return HIDDEN, (place.hidden_entry, False)
        if name.startswith("."):
            entry = place.hidden_entry
            return HIDDEN, (entry, False) if entry is not None else (PurePosixPath(relative), True)
        if not is_image_name(name):
            return (LABELS_FILE, None) if relative == self.labels_source else (NOT_IMAGE, None)
        if self.mode == "unlabeled":
            return TAKE, (None, None)
        if self.mode == "classes":
            return (TAKE, (place.label, None)) if place.parts else (REFUSE, "image outside any class folder")
        labels = self.labels or {}
        if relative in labels:
            key = relative
        elif name in labels and self.name_counts[name] == 1:
            key = name
        else:
            return REFUSE, f"not named in the labels file {self.labels_name}"
        if not labels[key]:
            return REFUSE, f"empty label in {self.labels_name}"
        return TAKE, (unicodedata.normalize("NFC", labels[key]), key)


@dataclass
class Plan:
    """The images to convert (walked by ``files`` and ``stored``, never held), and what planning found."""

    labeled: bool
    root: Path
    listing: FolderListing
    rules: LabellingRules
    classes: list[str] = field(default_factory=list)  # the planned images' labels, sorted
    count: int = 0  # images planned
    shared: set[tuple] = field(default_factory=set)  # stored folders that images of several folders go to
    refused: list[QuarantinedFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    renamed: Examples = field(default_factory=Examples)  # by the last ``stored`` walk

    def _taken(self) -> Iterator[tuple[Place | None, Folder, str | None, str | None]]:
        """(place, folder, name, label) of each planned image; (place, folder, None, None) at each folder's end."""
        base = self.rules.base
        for folder, name in self.listing.walk(base):
            place = self.rules.place(folder)
            if name is None:
                yield place, folder, None, None
                continue
            what, detail = self.rules.decide(place, name)
            if what == TAKE:
                yield place, folder, name, detail[0]

    def _source_file(self, place: Place, folder: Folder, name: str, label: str | None) -> SourceFile:
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
        (``folders``), every component made safe (``safe_name``; a file's name by ``stored_file_name``).

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
            stored_name, n = stored_file_name(name), 1
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
    keys = np.fromiter((hash(stored_file_name(n).casefold()) for n in folder.iter_names()), np.int64, folder.count)
    values, counts = np.unique(keys, return_counts=True)
    return set(values[counts > 1].tolist())
