"""A sharded scoring's parts: the ranges of the index each shard scores, the part of the table each writes, and
the merge of the parts into one scores table. Plain pandas: no torch, no Prefect.

A shard writes ``parts/part-NNN.csv`` whole (a file renamed into place, or one S3 PUT) and then
``parts/part-NNN.json``, its summary: a part with a summary is complete, and a shard run again writes both anew
instead of adding rows. Ranges are cut at multiples of the batch size, so each shard forms the very batches the
one-process scoring forms: the merged table equals that one value for value.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pandas as pd
from pydantic import BaseModel, Field

from tasks.contracts.scores_table import ERROR_COLUMN, ScoresSummary, read_scores, write_csv_bytes
from tasks.errors import FailedImagesError, PipelineInputError
from tasks.storage.local_files import write_text_atomic
from tasks.storage.s3 import is_s3_uri, parse_s3_uri, read_bytes, read_s3_object, s3_client, s3_writing

PARTS_FOLDER = "parts"
ShardPool = Literal["gpu", "default"]  # the pool shards run on: each has its deployment of flows/score_shard.py
SHARD_DEPLOYMENTS: dict[str, str] = {"gpu": "score-shard/score-shard", "default": "score-shard/score-shard-default"}
DEFAULT_TIMEOUT_S = 3600.0
NAMED_FAILURES = 10  # failed images an error message names; the rest are counted


class FailedImage(BaseModel):
    row: int = Field(description="the image's row in the ImageDirectory's index")
    image: str = Field(description="the image as the table names it (the user's own path)")
    error: str = Field(description="why it could not be scored")


class PartSummary(BaseModel):
    """What one shard scored (``part-NNN.json``, written after its part of the table)."""

    shard: int
    start: int
    stop: int
    rows: int
    failed: list[FailedImage] = []
    label_counts: dict[str, int] = Field(default_factory=dict, description="images per scored label")
    top_probability_sum: float = 0.0
    started_at: float = Field(0.0, description="when the shard's scoring began (Unix time)")
    first_image_at: float | None = Field(None, description="when its first batch was scored (Unix time)")
    seconds: float = Field(0.0, description="from fetching its images to its part written")


class ShardRange(BaseModel):
    shard: int
    start: int
    stop: int


def shard_ranges(images: int, shards: int, batch_size: int) -> list[ShardRange]:
    """``shards`` contiguous ranges of index rows covering ``images``, cut at multiples of ``batch_size`` and as
    even as that allows; fewer when there are fewer batches than shards (never an empty shard, but one range
    when there are no images)."""
    if shards < 1 or batch_size < 1:
        raise PipelineInputError(f"shards {shards} and batch_size {batch_size} must each be 1 or more")
    batches = -(-images // batch_size)
    count = max(1, min(shards, batches))
    cuts = [min(images, (k * batches // count) * batch_size) for k in range(count + 1)]
    return [ShardRange(shard=k, start=cuts[k], stop=cuts[k + 1]) for k in range(count)]


def check_sharding(shards: int, max_failed_images: int, timeout_s: float) -> None:
    """One line for a sharding that cannot be: fewer than 1 shard, a negative threshold, a timeout not > 0."""
    if shards < 1:
        raise PipelineInputError(f"shards {shards} is not allowed: 1 scores in the flow's process, more fan out")
    if max_failed_images < 0:
        raise PipelineInputError(f"max_failed_images {max_failed_images} is not allowed: use 0 or more")
    if not timeout_s > 0:
        raise PipelineInputError(f"shard_timeout_s {timeout_s} is not allowed: use seconds > 0")


def part_location(run_dir: str, shard: int) -> str:
    """Where shard ``shard`` of a run writes its part of the table (a path or S3 URI); its summary is beside it
    with ``.json`` for ``.csv``."""
    name = f"part-{shard:03d}.csv"
    return (
        f"{run_dir.rstrip('/')}/{PARTS_FOLDER}/{name}" if is_s3_uri(run_dir) else str(Path(run_dir, PARTS_FOLDER, name))
    )


def summary_location(part: str) -> str:
    return part.removesuffix(".csv") + ".json"


def write_summary(summary: PartSummary, part: str) -> None:
    text, location = summary.model_dump_json(indent=1), summary_location(part)
    if is_s3_uri(location):
        target = parse_s3_uri(location)
        with s3_writing(location):
            s3_client().put_object(Bucket=target.bucket, Key=target.prefix, Body=text.encode())
    else:
        write_text_atomic(location, text)


def read_summary(part: str) -> PartSummary | None:
    """A part's summary; None while the part is not complete."""
    location = summary_location(part)
    if is_s3_uri(location):
        data = read_s3_object(location)
    else:
        try:
            with open(location, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            data = None
    return None if data is None else PartSummary.model_validate_json(data)


def combined_summary(summaries: list[PartSummary], first_part: str, preview_rows: int) -> ScoresSummary:
    """The scores summary of the merged table, from the parts' summaries and the first part's first rows."""
    summary = ScoresSummary(preview_rows)
    for part in summaries:
        summary.rows += part.rows
        summary.counts.update(part.label_counts)
        summary.top_probabilities += part.top_probability_sum
    head = read_scores(first_part).head(preview_rows) if preview_rows else pd.DataFrame()
    summary.head, summary.columns = head, list(head.columns)
    return summary


def check_failures(summaries: list[PartSummary], max_failed_images: int) -> list[FailedImage]:
    """Every image the shards could not score; FailedImagesError, naming them, when more than
    ``max_failed_images``."""
    failed = [image for part in summaries for image in part.failed]
    if len(failed) > max_failed_images:
        named = "; ".join(f"{f.image} ({f.error})" for f in failed[:NAMED_FAILURES])
        more = f"; and {len(failed) - NAMED_FAILURES} more" if len(failed) > NAMED_FAILURES else ""
        raise FailedImagesError(
            f"{len(failed)} image{'s' if len(failed) > 1 else ''} could not be scored, more than max_failed_images "
            f"{max_failed_images} allows: "
            f"{named}{more}. Convert the images again, or raise max_failed_images to score the others"
        )
    return failed


def merge_parts(parts: list[str], summaries: list[PartSummary], output: str) -> None:
    """Write the parts, in order, as one scores table at ``output`` (a path or S3 URI). Without failed images
    the parts' bytes follow one header (no row is parsed: a million rows merge in seconds, a part in memory at a
    time); with some, an ``error`` column says why each such row has no scores."""
    if len(parts) != len(summaries) or any(p.rows != p.stop - p.start for p in summaries):
        raise RuntimeError(f"the parts {parts} do not match their summaries {summaries}")
    written = [0]
    failed = {f.row: f.error for part in summaries for f in part.failed}

    def pieces() -> Iterator[bytes]:
        header = None
        for part, summary in zip(parts, summaries):
            data = read_bytes(part)
            line, _, body = data.partition(b"\n")
            if header is None:
                header = line
                yield (line + b"," + ERROR_COLUMN.encode() if failed else line) + b"\n"
            elif line != header:
                raise RuntimeError(f"{part} has the columns {line[:200]!r}, the first part {header[:200]!r}")
            if failed:
                body = _with_errors(body, header, summary, failed)
            written[0] += len(body)
            yield body

    write_csv_bytes(pieces(), output, lambda: written[0])


def _with_errors(body: bytes, header: bytes, part: PartSummary, failed: dict[int, str]) -> bytes:
    table = pd.read_csv(io.BytesIO(header + b"\n" + body), dtype=str, keep_default_na=False)
    errors = [failed.get(row, "") for row in range(part.start, part.stop)]
    if len(table) != len(errors):
        raise RuntimeError(f"part {part.shard} holds {len(table)} rows, its summary {len(errors)}")
    table[ERROR_COLUMN] = errors
    return table.to_csv(index=False, header=False).encode()
