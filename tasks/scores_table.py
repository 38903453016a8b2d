"""The scores table: the contract between Score Image Model and Evaluate Model, written once.

A CSV with one row per image: ``image`` (the user's own path of it), ``Scored Labels``,
``Scored Probabilities_<class>`` per class in the model's output order (Azure's column names), with ``top_k``
scoring ``Top 1 Label``, ``Top 1 Probability`` ... after them, and ``label`` when the images were labeled.
Plain pandas: no torch, no Prefect.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pandas as pd

from tasks.fileio import atomic_write, storage_faults
from tasks.storage import is_s3_uri, parse_s3_uri, read_bytes, s3_client, s3_writing

SCORED_LABELS = "Scored Labels"
PROBABILITY_PREFIX = "Scored Probabilities_"
IMAGE_COLUMN = "image"
LABEL_COLUMN = "label"
_TOP_LABEL = re.compile(r"Top [0-9]+ Label")


def probability_column(class_name: str) -> str:
    return f"{PROBABILITY_PREFIX}{class_name}"


def top_k_columns(rank: int) -> tuple[str, str]:
    """The label and probability columns of the ``rank``-th best class (1 = the scored label). Named apart
    from Azure's ``Scored ...`` columns, which readers of the table pick by prefix."""
    return f"Top {rank} Label", f"Top {rank} Probability"


def scored_classes(scores: pd.DataFrame) -> list[str]:
    """The class names of a scores table, in model output order."""
    return [c[len(PROBABILITY_PREFIX) :] for c in scores.columns if c.startswith(PROBABILITY_PREFIX)]


def read_scores(location: str | Path) -> pd.DataFrame:
    """Read a scores CSV (a path or s3:// URI) keeping class names as text ('01' stays '01')."""
    data = read_bytes(location)
    top_labels = [c for c in pd.read_csv(io.BytesIO(data), nrows=0).columns if _TOP_LABEL.fullmatch(c)]
    text = dict.fromkeys([IMAGE_COLUMN, SCORED_LABELS, LABEL_COLUMN, *top_labels], str)
    return pd.read_csv(io.BytesIO(data), dtype=text)


def write_scores(table: pd.DataFrame, location: str) -> str:
    """Write the scores CSV to a path (atomically) or to ``s3://bucket/key.csv``."""
    data = table.to_csv(index=False).encode()
    if is_s3_uri(location):
        target = parse_s3_uri(location)
        with s3_writing(location):
            s3_client().put_object(Bucket=target.bucket, Key=target.prefix, Body=data, ContentType="text/csv")
    else:
        # Nothing is left at location but the complete table.
        with storage_faults(f"the scores table {location}", len(data)), atomic_write(location, "wb") as handle:
            handle.write(data)
    return location


def scores_summary(table: pd.DataFrame) -> str:
    """Images per scored label, and how sure the model was (mean of each row's highest probability)."""
    if table.empty:
        return "no images"
    counts = table[SCORED_LABELS].value_counts().sort_index()
    confidence = table[[c for c in table.columns if c.startswith(PROBABILITY_PREFIX)]].max(axis=1).mean()
    return f"scored labels: {', '.join(f'{k}: {v}' for k, v in counts.items())}; mean top probability {confidence:.3f}"
