"""The scores table: the contract between Score Image Model and Evaluate Model, written once.

A CSV with one row per image: ``image`` (the user's own path of it), ``Scored Labels``,
``Scored Probabilities_<class>`` per class in the model's output order (Azure's column names), with ``top_k``
scoring ``Top 1 Label``, ``Top 1 Probability`` ... after them, and ``label`` when the images were labeled.
Written a chunk of rows at a time (``write_score_chunks``): scoring a million images never holds their table.
Plain pandas: no torch, no Prefect. The parameters of scoring that the flows take (``Runtime``,
``Precision``, ``BATCH_SIZE``) are here too, so that a flow's signature does not import torch.
"""

from __future__ import annotations

import io
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Literal

import pandas as pd

from tasks.storage.local_files import atomic_write, storage_faults
from tasks.storage.s3 import is_s3_uri, parse_s3_uri, read_bytes, s3_client, s3_writing

# How a table is scored: by PyTorch or by onnxruntime on the exported model, this many images at a time.
Runtime = Literal["torch", "onnx"]
# fp32; bf16 autocast (a GPU's); int8: ONNX Runtime's static quantization on the CPU (tasks/inference/int8.py).
Precision = Literal["fp32", "bf16", "int8"]
BATCH_SIZE = 64

SCORED_LABELS = "Scored Labels"
PROBABILITY_PREFIX = "Scored Probabilities_"
IMAGE_COLUMN = "image"
LABEL_COLUMN = "label"
# Sharded scoring (tasks/score_shards): why an image has no scores; the column is there only when one has none.
ERROR_COLUMN = "error"
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
    text = dict.fromkeys([IMAGE_COLUMN, SCORED_LABELS, LABEL_COLUMN, ERROR_COLUMN, *top_labels], str)
    return pd.read_csv(io.BytesIO(data), dtype=text)


class ScoresSummary:
    """What a scores table adds up to, gathered chunk by chunk: rows, images per scored label, the mean of each
    row's highest probability, and its first ``preview_rows`` rows."""

    def __init__(self, preview_rows: int = 0) -> None:
        self.rows, self.preview_rows = 0, preview_rows
        self.counts: Counter[str] = Counter()
        self.top_probabilities = 0.0
        self.head = pd.DataFrame()
        self.columns: list[str] = []

    def add(self, chunk: pd.DataFrame) -> None:
        self.columns = list(chunk.columns)
        if len(self.head) < self.preview_rows:
            self.head = pd.concat([self.head, chunk.head(self.preview_rows - len(self.head))], ignore_index=True)
        if chunk.empty:
            return
        self.rows += len(chunk)
        if SCORED_LABELS in chunk.columns:
            self.counts.update(chunk[SCORED_LABELS].value_counts().to_dict())
        if probabilities := [c for c in chunk.columns if c.startswith(PROBABILITY_PREFIX)]:
            self.top_probabilities += float(chunk[probabilities].max(axis=1).sum())

    def text(self) -> str:
        """Images per scored label, and how sure the model was (mean of each row's highest probability)."""
        if not self.rows:
            return "no images"
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items()))
        return f"scored labels: {counts}; mean top probability {self.top_probabilities / self.rows:.3f}"


def write_score_chunks(
    chunks: Iterable[pd.DataFrame], location: str, *, rows: int | None = None, preview_rows: int = 0
) -> ScoresSummary:
    """Write a scores CSV given in chunks of rows (the first names the columns) to a path, atomically, or to
    ``s3://bucket/key.csv`` (spooled to a temporary file, then streamed from it in one PUT): one chunk in memory at a time.
    ``rows``: how many there will be, for the space a full disk is told is needed."""
    summary, written = ScoresSummary(preview_rows), [0]

    def pieces() -> Iterator[bytes]:
        for number, chunk in enumerate(chunks):
            data = chunk.to_csv(index=False, header=number == 0).encode()
            written[0] += len(data)  # counted first: a fault writing it says what it needed
            summary.add(chunk)
            yield data

    def needed() -> int:
        return int(written[0] / summary.rows * rows) if rows and summary.rows else written[0]

    write_csv_bytes(pieces(), location, needed)
    return summary


def write_csv_bytes(pieces: Iterable[bytes], location: str, needed: Callable[[], int]) -> None:
    """Write a CSV given as pieces of bytes to a path, atomically (nothing is left at ``location`` but the
    complete table), or to ``s3://bucket/key.csv`` (spooled to a temporary file, then one PUT); ``needed``: the
    bytes a full disk is told are needed."""
    if is_s3_uri(location):
        target = parse_s3_uri(location)
        with tempfile.TemporaryFile() as spool:
            for piece in pieces:
                spool.write(piece)
            spool.seek(0)
            with s3_writing(location):
                s3_client().put_object(Bucket=target.bucket, Key=target.prefix, Body=spool, ContentType="text/csv")
    else:
        with storage_faults(f"the scores table {location}", needed), atomic_write(location, "wb") as handle:
            for piece in pieces:
                handle.write(piece)


def write_scores(table: pd.DataFrame, location: str) -> str:
    """Write a whole scores table to a path (atomically) or to ``s3://bucket/key.csv``."""
    write_score_chunks([table], location, rows=len(table))
    return location


def scores_summary(table: pd.DataFrame) -> str:
    """Images per scored label, and how sure the model was (mean of each row's highest probability)."""
    summary = ScoresSummary()
    summary.add(table)
    return summary.text()
