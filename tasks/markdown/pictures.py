"""PNG pictures inline in markdown: a data URI, which the Prefect UI shows in a markdown artifact with no file
server needed (the training curves, the confusion matrix, the sweep's pictures, the gallery, the model card)."""

from __future__ import annotations

import base64
import os
from pathlib import Path


def png_markdown_of(data: bytes, alt: str) -> str:
    """A markdown image of the PNG ``data``, inline."""
    return f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode('ascii')})"


def png_markdown(path: str | os.PathLike[str], alt: str) -> str:
    """A markdown image of the PNG file at ``path``, inline."""
    return png_markdown_of(Path(path).read_bytes(), alt)
