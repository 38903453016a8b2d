"""A labels file: a CSV with ``image`` and ``label`` columns or a JSON object ``{"<image>": "<label>"}``, in UTF-8,
UTF-16 or UTF-32 with a byte-order mark, or Windows-1252 (what Excel saves); read into image name -> label."""

from __future__ import annotations

import codecs
import csv
import io
import json

from tasks.errors import InvalidDatasetError

# Byte-order marks that name their encoding; UTF-32's come first, as UTF-16 LE's is a prefix of UTF-32 LE's.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def decode_labels_file(data: bytes, name: str) -> str:
    """UTF-8, or the encoding a byte-order mark names (UTF-16, UTF-32), else Windows-1252 (Excel's CSV)."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError as error:
                raise InvalidDatasetError(
                    f"labels file {name} starts with a {encoding} byte-order mark but is not valid {encoding} "
                    f"({error.reason} at byte {error.start}): save it again as UTF-8"
                ) from error
    if b"\0" in data:
        raise InvalidDatasetError(
            f"labels file {name} holds NUL bytes: UTF-16 without a byte-order mark, or not text at all. "
            "Accepted: UTF-8, UTF-16 or UTF-32 with a byte-order mark, Windows-1252; save it as UTF-8"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError as error:
        raise InvalidDatasetError(
            f"labels file {name} is neither UTF-8 nor Windows-1252 (byte {data[error.start]:#04x} at offset "
            f"{error.start}); accepted: UTF-8, UTF-16 or UTF-32 with a byte-order mark, Windows-1252"
        ) from error


def read_labels_file(data: bytes, name: str) -> dict[str, str]:
    """Image name -> label from a CSV (``image``, ``label`` columns) or a JSON object."""
    text = decode_labels_file(data, name)
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
