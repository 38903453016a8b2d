"""The validation images the model got wrong most confidently, as thumbnails with their true and predicted
labels: where a person looks first for label mistakes, look-alike classes or a broken preprocessing step."""

from __future__ import annotations

import io

import pandas as pd
from PIL import Image, ImageOps

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.scores_table import IMAGE_COLUMN, LABEL_COLUMN, PROBABILITY_PREFIX, SCORED_LABELS
from tasks.markdown import png_markdown_of

THUMBNAIL_PX = 96
GALLERY_SIZE = 16


def confident_mistakes(scores: pd.DataFrame, count: int = GALLERY_SIZE) -> pd.DataFrame:
    """The ``count`` misclassified rows of a labeled scores table, the most confident (highest probability of
    the scored label) first, with that probability as column ``confidence``."""
    wrong = scores[scores[LABEL_COLUMN] != scores[SCORED_LABELS]]
    confidence = wrong[[c for c in scores.columns if c.startswith(PROBABILITY_PREFIX)]].max(axis=1)
    return wrong.assign(confidence=confidence).sort_values("confidence", ascending=False, kind="stable").head(count)


def thumbnail_markdown(image: Image.Image, alt: str) -> str:
    """The image, upright as displayed (its EXIF orientation applied), shrunk to at most THUMBNAIL_PX a side (tiny
    ones enlarged to it, pixels kept sharp), inline."""
    image = ImageOps.exif_transpose(image)
    scale = THUMBNAIL_PX / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    buffer = io.BytesIO()
    image.convert("RGB").resize(size, Image.Resampling.NEAREST if scale > 1 else Image.Resampling.LANCZOS).save(
        buffer, "PNG"
    )
    return png_markdown_of(buffer.getvalue(), alt)


def gallery_markdown(scores: pd.DataFrame, images: ImageDirectory, count: int = GALLERY_SIZE) -> tuple[str, str]:
    """(markdown, one-line description) of the gallery of ``confident_mistakes`` of ``images``' scores."""
    mistakes = confident_mistakes(scores, count)
    wrong = int((scores[LABEL_COLUMN] != scores[SCORED_LABELS]).sum())
    description = f"{wrong} of {len(scores)} validation images misclassified" + (
        f"; the {len(mistakes)} most confident shown" if wrong else ""
    )
    if mistakes.empty:
        return (
            f"### Misclassified validation images\n\nNone: all {len(scores)} images got their true label.\n",
            description,
        )
    # The table names images as the user did; the manifest knows where each is stored.
    index = images.index
    stored = {s or p: images.root / p for s, p in zip(index.source_path, index.path)}
    rows = []
    for row in mistakes.to_dict(orient="records"):
        name, true, predicted = row[IMAGE_COLUMN], row[LABEL_COLUMN], row[SCORED_LABELS]
        with Image.open(stored[name]) as image:
            picture = thumbnail_markdown(image, f"{true} scored as {predicted}")
        cells = [picture, true, predicted, f"{row['confidence']:.3f}", f"`{name}`"]
        rows.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(
        [
            "### Misclassified validation images, most confident first",
            "",
            "| image | true label | predicted | confidence | file |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    ), description
