"""Helpers of the monitoring tests: new photos of the colours, and the records of their real answers by the real
model, as the endpoint writes them (tasks/serving/model.py's record), published as a segment."""

from __future__ import annotations

import datetime as dt
import hashlib
import io

import numpy as np
from PIL import Image

from tasks.inference.loaded import LoadedModel
from tasks.inference.networks import probabilities_of
from tasks.monitoring.records import RecordFolder, encode, project, segment_name
from tasks.vision.images import image_properties
from tests.helpers import COLOURS, NAME

START = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def photos(count: int, grey: bool = False, size: int = 16) -> list[bytes]:
    """``count`` new PNG photos of the colours, in turn (noise seeded apart from the training's)."""
    rng, found = np.random.default_rng(7), []
    for i in range(count):
        rgb = np.array(list(COLOURS.values())[i % len(COLOURS)])
        pixels = np.clip(rgb + rng.integers(-25, 25, (size, size, 3)), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels, "RGB")
        encoded = io.BytesIO()
        (image.convert("L") if grey else image).save(encoded, format="PNG")
        found.append(encoded.getvalue())
    return found


def answer(model: LoadedModel, images: list[bytes], version: int = 1) -> list[dict]:
    """The records the endpoint writes for ``images`` answered by ``model`` (version ``version`` of ``NAME``), a
    second apart from ``START``."""
    outputs = model.outputs([model.decode(data) for data in images])
    probabilities = probabilities_of(outputs)
    embeddings = project(outputs.embeddings.float().numpy())
    records = []
    for i, (data, row) in enumerate(zip(images, probabilities.float().numpy(), strict=True)):
        order = row.argsort()[::-1][:5]
        records.append(
            {
                "time": (START + dt.timedelta(seconds=i)).isoformat(),
                "sha256": hashlib.sha256(data).hexdigest(),
                "model": NAME,
                "version": version,
                "precision": "fp32",
                "label": model.classes[order[0]],
                "confidence": float(row[order[0]]),
                "top": {model.classes[j]: float(row[j]) for j in order},
                **image_properties(data),
                "embedding": embeddings[i].tolist(),
                "image": None,
            }
        )
    return records


def publish(folder: str, records: list[dict], images: list[bytes] | None = None, sequence: int = 1) -> None:
    """``records`` as segment ``sequence`` in ``folder`` (their images' bytes stored too, when given)."""
    target = RecordFolder(folder)
    for record, data in zip(records, images or [], strict=False):
        record["image"] = target.store_image(record["sha256"], data)
    target.publish(segment_name(START, sequence), encode(records))
