"""One walk of a local folder: what can be read below it, and what was skipped with the reason.

Links are followed only where they resolve inside the folder; links leading out of it, broken links, link
loops and anything that is not a regular file or folder (FIFOs, sockets, devices) are skipped, each reported
with the reason. Litter that operating systems leave behind is left out without a word.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tasks.image_directory import MANIFEST_NAME, QuarantinedFile
from tasks.image_index import INDEX_NAME

# An ImageDirectory given as a source is read as the class folders it is, without its manifest.
IGNORED_NAMES = frozenset({"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini", MANIFEST_NAME, INDEX_NAME})


def is_os_litter(name: str) -> bool:
    """Files that operating systems leave behind (and a manifest of an ImageDirectory given as a source)."""
    return name in IGNORED_NAMES or name.startswith("._")  # "._x": macOS AppleDouble metadata of x


@dataclass
class FolderListing:
    """Everything below a folder, relative to it: what can be read, and what was skipped with the reason."""

    files: list[PurePosixPath] = field(default_factory=list)
    folders: list[PurePosixPath] = field(default_factory=list)
    skipped: list[QuarantinedFile] = field(default_factory=list)


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
    """Walk ``root`` once, following links that stay inside it; OS litter (__MACOSX, .DS_Store, Thumbs.db) is left out without a word."""
    root = root.resolve()
    listing = FolderListing()

    def skip(relative: PurePosixPath, reason: str) -> None:
        listing.skipped.append(QuarantinedFile(path=relative.as_posix(), reason=reason))

    def visit(folder: Path, relative: PurePosixPath, chain: frozenset[Path]) -> None:
        with os.scandir(folder) as scan:
            entries = sorted(scan, key=lambda e: e.name)
        for entry in entries:
            path, relative_path = Path(entry.path), relative / entry.name
            if is_os_litter(entry.name):
                continue
            if entry.is_symlink() and (problem := _link_problem(path, root)):
                skip(relative_path, problem)
                continue
            try:
                mode = path.stat().st_mode
            except OSError as error:
                skip(relative_path, f"cannot be read: {error.strerror}")
                continue
            if stat.S_ISDIR(mode):
                real = path.resolve()
                if real in chain:  # a link back to a folder that holds it
                    skip(
                        relative_path, f"link to {os.readlink(path)!r}, a folder that holds it: following it would loop"
                    )
                    continue
                listing.folders.append(relative_path)
                visit(path, relative_path, chain | {real})
            elif stat.S_ISREG(mode):
                listing.files.append(relative_path)
            else:
                kind = next((k for test, k in _SPECIAL_KINDS.items() if test(mode)), "not a regular file")
                skip(relative_path, f"{kind}, not a regular file: only files, folders and links to them are read")

    visit(root, PurePosixPath(), frozenset({root}))
    listing.files.sort()
    return listing
