"""The files of an ImageDirectory: which of a source's files are images, the name each is stored under, and which
way up it is stored (its EXIF orientation).

A class's folder is its name made safe for Linux, macOS and Windows (``safe_name``, made unique by
``class_folders``): most names are unchanged, and the manifest keeps the readable name. Phones' formats that not
every decode path reads are stored re-encoded as JPEG, under a name of their own (``stored_file_name``).
"""

from __future__ import annotations

import hashlib
import os
import unicodedata

try:  # HEIC/HEIF, the iPhone's format: Pillow reads it once pillow-heif has registered its opener
    from pillow_heif import register_heif_opener

    register_heif_opener()
    HEIF_READER: str | None = None
except ImportError:  # a host installed with --no-deps (the GPU hosts): HEIC files are quarantined, saying why
    HEIF_READER = "HEIC/HEIF needs pillow-heif, which is not installed here: pip install pillow-heif"

# Formats stored re-encoded as JPEG (quality 95, RGB): phones' formats that not every decode path reads (nvJPEG,
# torchvision, onnx checks). HEIC/HEIF through pillow-heif, AVIF through Pillow itself.
REENCODED_AS_JPEG = frozenset({"HEIF", "AVIF"})
REENCODED_EXTENSIONS = frozenset({".heic", ".heif", ".avif"})
IMAGE_EXTENSIONS = (
    frozenset({".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}) | REENCODED_EXTENSIONS
)

# Characters Windows refuses in names (and "%", which escapes them); names Windows reserves for devices.
_UNSAFE_CHARACTERS = frozenset('<>:"/\\|?*%') | {chr(c) for c in range(32)} | {chr(127)}
_RESERVED_NAMES = frozenset({"con", "prn", "aux", "nul"} | {f"{d}{i}" for d in ("com", "lpt") for i in range(1, 10)})
_MAX_NAME_BYTES = 255
_MAX_SUFFIX_BYTES = 16


EXIF_ORIENTATION = 0x0112  # the EXIF tag (1-8) every viewer turns a photo by; 1: shown as stored


def orientation_of(image) -> int:
    """The EXIF orientation (1-8) of an opened PIL image, from its header: 1 when it has none or not one of the
    eight. A PNG's eXIf chunk counts only when it comes before the image data (where Pillow reads it on opening):
    asking for one after would decode the whole image."""
    if image.format == "PNG" and "exif" not in image.info:
        return 1
    value = image.getexif().get(EXIF_ORIENTATION, 1)
    return value if value in range(1, 9) else 1


def stored_file_name(name: str) -> str:
    """The name an image is stored under: ``safe_name``, and ``.jpg`` after a format stored as JPEG
    (``IMG_0001.HEIC`` -> ``IMG_0001.HEIC.jpg``: no other file's name can be the same)."""
    safe = safe_name(name)
    return safe + ".jpg" if os.path.splitext(name)[1].lower() in REENCODED_EXTENSIONS else safe


def safe_name(name: str) -> str:
    """``name`` as one path component that is legal and visible on Linux, macOS and Windows.

    Unsafe characters become ``%XX`` (UTF-8 bytes) and ``%`` itself is escaped, so distinct names stay
    distinct; spaces and unicode letters are kept (NFC, the form Linux and Windows store). A leading dot
    (hidden), a trailing dot or space (dropped by Windows) and reserved device names are escaped too.
    """
    if not name:
        raise ValueError("an empty name has no safe form")
    name = unicodedata.normalize("NFC", name)
    chars = ["".join(f"%{b:02X}" for b in c.encode()) if c in _UNSAFE_CHARACTERS else c for c in name]
    if chars[0] == ".":
        chars[0] = "%2E"
    if chars[-1] in (".", " "):
        chars[-1] = f"%{ord(chars[-1]):02X}"
    if name.split(".")[0].lower() in _RESERVED_NAMES:
        chars[0] = f"%{ord(name[0]):02X}"
    safe = "".join(chars)
    if len(safe.encode()) > _MAX_NAME_BYTES:
        # Cut the stem, never the extension (readers pick images by it); the digest keeps cut names distinct.
        stem, suffix = os.path.splitext(safe)
        if len(suffix.encode()) > _MAX_SUFFIX_BYTES:
            stem, suffix = safe, ""
        tail = f"~{hashlib.sha256(name.encode()).hexdigest()[:16]}{suffix}"
        safe = stem.encode()[: _MAX_NAME_BYTES - len(tail.encode())].decode(errors="ignore") + tail
    return safe


def class_folders(classes: list[str]) -> dict[str, str]:
    """A folder per class: ``safe_name``, made unique where only letter case differs (macOS, Windows)."""
    folders: dict[str, str] = {}
    taken: set[str] = set()
    for name in classes:
        folder, n = safe_name(name), 1
        while folder.casefold() in taken:
            n += 1
            folder = f"{safe_name(name)}~{n}"
        taken.add(folder.casefold())
        folders[name] = folder
    return folders
