"""The gallery of confidently misclassified validation images: pure on a known scores table, then as the
``misclassified-images`` artifact of a real Prefect server."""

from __future__ import annotations

import asyncio
import base64
import io
import re

import pandas as pd
from PIL import Image
from prefect import flow

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.scores_table import write_scores
from tasks.evaluation.gallery import THUMBNAIL_PX, gallery_markdown
from tasks.evaluation.prefect_tasks import show_misclassified
from tests.helpers import card_versions

CLASSES = ["blue", "green", "red"]


def scores_with_mistakes(images: ImageDirectory) -> pd.DataFrame:
    """Every image scored right with 0.9, except three scored as the next class with 0.6, 0.95 and 0.7."""
    records = images.records()
    wrong = {records[0].path: 0.6, records[5].path: 0.95, records[9].path: 0.7}
    rows = []
    for record in records:
        predicted = CLASSES[(CLASSES.index(record.label) + 1) % 3] if record.path in wrong else record.label
        top = wrong.get(record.path, 0.9)
        rows.append(
            {
                "image": record.source_path or record.path,
                "Scored Labels": predicted,
                **{f"Scored Probabilities_{c}": top if c == predicted else (1 - top) / 2 for c in CLASSES},
                "label": record.label,
            }
        )
    return pd.DataFrame(rows)


def test_the_gallery_shows_the_most_confident_mistakes_first_as_thumbnails(colour_image_dirs):
    images = ImageDirectory(colour_image_dirs[1])
    scores = scores_with_mistakes(images)
    markdown, description = gallery_markdown(scores, images, count=2)

    assert description == "3 of 12 validation images misclassified; the 2 most confident shown"
    rows = [line for line in markdown.splitlines() if line.startswith("| ![")]
    misclassified = set(scores.loc[scores["label"] != scores["Scored Labels"], "image"])
    assert [row.split(" | ")[3] for row in rows] == ["0.950", "0.700"]
    for row in rows:
        _, true, predicted, _, name = row.strip("| ").split(" | ")
        assert predicted != true and name.strip("`") in misclassified
        encoded = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)\)", row)[1]
        with Image.open(io.BytesIO(base64.b64decode(encoded))) as thumbnail:
            assert thumbnail.size == (THUMBNAIL_PX, THUMBNAIL_PX), "16 px images enlarged to be seen"

    right = scores.assign(**{"Scored Labels": scores["label"]})
    assert gallery_markdown(right, images)[1] == "0 of 12 validation images misclassified"


def test_the_gallery_is_an_artifact_of_the_run(prefect_server, colour_image_dirs, tmp_path):
    images = ImageDirectory(colour_image_dirs[1])
    csv = write_scores(scores_with_mistakes(images), str(tmp_path / "scores.csv"))

    @flow(name="gallery")
    def gallery():
        return show_misclassified(csv, str(images.root))

    described = gallery()
    assert described == "3 of 12 validation images misclassified; the 3 most confident shown"
    artifact = asyncio.run(card_versions("misclassified-images"))[-1]
    assert artifact.description == described and artifact.data.count("data:image/png;base64,") == 3
