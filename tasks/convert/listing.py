"""One walk of a local folder: what can be read below it, and what was skipped with the reason.

Links are followed only where they resolve inside the folder; links leading out of it, broken links, link
loops and anything that is not a regular file or folder (FIFOs, sockets, devices) are skipped, each reported
with the reason. Litter that operating systems leave behind is left out without a word.

The listing is a tree of folders, each holding its files' names in one string: a conversion of a million images
keeps its listing in about the bytes of their names (no object per file). ``files`` walks it in path order (the
order of ``sorted`` on the files' ``PurePosixPath``), depth first.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tasks.contracts.image_directory import MANIFEST_NAME, QuarantinedFile
from tasks.contracts.image_index import INDEX_NAME

# An ImageDirectory given as a source is read as the class folders it is, without its manifest.
IGNORED_NAMES = frozenset({"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini", MANIFEST_NAME, INDEX_NAME})


def is_left_by_the_os(name: str) -> bool:
    """Files that operating systems leave behind (and a manifest of an ImageDirectory given as a source)."""
    return name in IGNORED_NAMES or name.startswith("._")  # "._x": macOS AppleDouble metadata of x


class Folder:
    """One folder of a listing: its path below the root, its files' names (sorted) and its folders' names."""

    __slots__ = ("relative", "_names", "count", "subfolders")

    def __init__(self, relative: PurePosixPath, names: list[str], subfolders: list[str]) -> None:
        self.relative, self.count, self.subfolders = relative, len(names), subfolders
        self._names = "\0".join(names)  # no file name holds a NUL

    @property
    def names(self) -> list[str]:
        return self._names.split("\0") if self.count else []

    def iter_names(self) -> Iterator[str]:
        """The names one at a time (no list of a large folder's names)."""
        start, names = 0, self._names
        for _ in range(self.count):
            end = names.find("\0", start)
            yield names[start:] if end < 0 else names[start:end]
            start = end + 1


@dataclass
class FolderListing:
    """Everything below a folder, relative to it: its folders (the root is ``PurePosixPath()``), in the order of a
    walk, and what was skipped with the reason."""

    folders: dict[PurePosixPath, Folder] = field(default_factory=dict)
    skipped: list[QuarantinedFile] = field(default_factory=list)

    def walk(self, folder: PurePosixPath = PurePosixPath()) -> Iterator[tuple[Folder, str | None]]:
        """``folder``'s files (folder, name) in path order, depth first; after each folder's last file, (folder,
        None): the folder is done."""
        here = self.folders[folder]
        names, subfolders = here.iter_names(), iter(here.subfolders)
        name, subfolder = next(names, None), next(subfolders, None)
        while name is not None or subfolder is not None:
            if subfolder is None or (name is not None and name < subfolder):
                yield here, name
                name = next(names, None)
            else:
                yield from self.walk(folder / subfolder)
                subfolder = next(subfolders, None)
        yield here, None

    def files(self) -> Iterator[PurePosixPath]:
        """Every file, relative to the root, in path order."""
        for folder, name in self.walk():
            if name is not None:
                yield folder.relative / name


_SPECIAL_KINDS = {
    stat.S_ISFIFO: "a FIFO",
    stat.S_ISSOCK: "a socket",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
}


def _link_problem(path: Path, root: Path) -> str | None:
    target = os.readlink(path)
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):  # RuntimeError: a link loop (Python < 3.13)
        return f"broken link to {target!r}: its target does not exist"
    if not resolved.is_relative_to(root):
        return f"link to {target!r}, outside the source: links are followed only where they stay inside it"
    return None


def list_folder(root: Path) -> FolderListing:
    """Walk ``root`` once, following links that stay inside it; files the OS leaves behind (__MACOSX, .DS_Store, Thumbs.db) are left out without a word."""
    root = root.resolve()
    listing = FolderListing()

    def skip(relative: PurePosixPath, reason: str) -> None:
        listing.skipped.append(QuarantinedFile(path=relative.as_posix(), reason=reason))

    def mode_of(entry: os.DirEntry, relative: PurePosixPath) -> int | None:
        """The entry's file type (a link's target's), or None when it is skipped. A plain file or folder costs no
        system call: the type comes with the folder's listing."""
        if not entry.is_symlink():
            if entry.is_dir(follow_symlinks=False):
                return stat.S_IFDIR
        elif problem := _link_problem(Path(entry.path), root):
            skip(relative, problem)
            return None
        try:
            return entry.stat().st_mode
        except OSError as error:
            skip(relative, f"cannot be read: {error.strerror}")
            return None

    def visit(folder: Path, relative: PurePosixPath, chain: frozenset[Path]) -> None:
        # Only the names of plain files are kept from the scan (a DirEntry is several times larger than its
        # name, and a folder may hold a million files); the rest is looked at in name order, as it was listed.
        names, others = [], []
        with os.scandir(folder) as scan:
            for entry in scan:
                if is_left_by_the_os(entry.name):
                    continue
                if entry.is_file(follow_symlinks=False) and not entry.is_symlink():
                    names.append(entry.name)
                else:
                    others.append(entry)
        names.sort()
        others.sort(key=lambda e: e.name)
        subfolders = []
        for entry in others:
            relative_path = relative / entry.name
            if (mode := mode_of(entry, relative_path)) is None:
                continue
            if stat.S_ISDIR(mode):
                real = Path(entry.path).resolve()
                if real in chain:  # a link back to a folder that holds it
                    skip(
                        relative_path,
                        f"link to {os.readlink(entry.path)!r}, a folder that holds it: following it would loop",
                    )
                    continue
                subfolders.append(entry.name)
                visit(Path(entry.path), relative_path, chain | {real})
            elif stat.S_ISREG(mode):
                names.append(entry.name)
            else:
                kind = next((k for test, k in _SPECIAL_KINDS.items() if test(mode)), "not a regular file")
                skip(relative_path, f"{kind}, not a regular file: only files, folders and links to them are read")
        if others:
            names.sort()  # links to files join the plain ones
        listing.folders[relative] = Folder(relative, names, subfolders)

    visit(root, PurePosixPath(), frozenset({root}))
    return listing
