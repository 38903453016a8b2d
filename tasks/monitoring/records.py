"""What the endpoint records of each image it answers, and the folder (or ``s3://`` prefix) it records into.

A record is one JSON object a line: ``time`` (UTC, ISO 8601), ``sha256`` (of the image's bytes), ``model``,
``version``, ``precision``, ``label``, ``confidence`` (the top probability), ``top`` (the five most probable
classes and their probabilities), ``width``, ``height``, ``mode``, ``orientation`` (EXIF, 1-8), ``embedding`` (the
penultimate layer's embedding through ``project``: 32 numbers) and ``image`` (where the image's bytes were stored,
relative to the folder, or null). Records are published in segments, ``answers/<start>-<pid>-<n>.jsonl.gz``, each
whole (written aside, then renamed; an S3 object is whole when it appears): pandas
(``pd.read_json(path, lines=True)``) and DuckDB (``read_json('answers/*.jsonl.gz')``) read them as they are. An
image's bytes, when asked for, are stored once per sha256 under ``images/<sha256[:2]>/<sha256>``.

Reading (``read_records``) skips a damaged or half-written segment, naming it, and keeps the records of one model.
Imports no torch, no Prefect."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from tasks.errors import PipelineInputError
from tasks.storage.local_files import atomic_write
from tasks.storage.s3 import is_s3_uri, list_s3_names, parse_s3_uri, read_s3_object, s3_client

ANSWERS, IMAGES = "answers", "images"
SEGMENT = re.compile(r"^(\d{8}T\d{6}Z)-(\d+)-(\d+)\.jsonl\.gz$")
TOP = 5
EMBEDDING_SIZE = 32
COLUMNS = (
    "time",
    "sha256",
    "model",
    "version",
    "precision",
    "label",
    "confidence",
    "top",
    "width",
    "height",
    "mode",
    "orientation",
    "embedding",
    "image",
)


def project(embeddings: np.ndarray) -> np.ndarray:
    """Embeddings (N, D) to ``EMBEDDING_SIZE`` numbers each, by one fixed random projection per D (seeded, the same
    in every process): distances between images are kept about as they were (Johnson-Lindenstrauss), at a size a
    record can carry and a two-sample test can take."""
    matrix = np.random.default_rng(embeddings.shape[1]).standard_normal((embeddings.shape[1], EMBEDDING_SIZE))
    return (embeddings.astype(np.float64) @ matrix / np.sqrt(EMBEDDING_SIZE)).astype(np.float32)


def segment_name(start: dt.datetime, sequence: int) -> str:
    return f"{start.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}-{os.getpid()}-{sequence}.jsonl.gz"


def segment_time(name: str) -> dt.datetime | None:
    found = SEGMENT.match(name)
    return dt.datetime.strptime(found[1], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC) if found else None


def encode(records: Iterable[dict]) -> bytes:
    lines = "".join(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n" for record in records)
    return gzip.compress(lines.encode(), compresslevel=5)


@dataclass
class RecordFolder:
    """A folder or ``s3://bucket/prefix`` that records are published into and read from."""

    location: str
    _client: object = field(default=None, repr=False)

    @property
    def on_s3(self) -> bool:
        return is_s3_uri(self.location)

    def client(self):
        if self._client is None:
            self._client = s3_client()
        return self._client

    def publish(self, name: str, data: bytes) -> int:
        """One segment, whole; its size in bytes."""
        self.write(f"{ANSWERS}/{name}", data)
        return len(data)

    def write(self, relative: str, data: bytes) -> None:
        if self.on_s3:
            where = parse_s3_uri(self.location.rstrip("/") + "/" + relative)
            self.client().put_object(Bucket=where.bucket, Key=where.key, Body=data)
            return
        path = Path(self.location) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "wb") as handle:
            handle.write(data)

    def has(self, relative: str) -> bool:
        if self.on_s3:
            return read_s3_object(self.location.rstrip("/") + "/" + relative) is not None
        return (Path(self.location) / relative).is_file()

    def store_image(self, sha256: str, data: bytes) -> str:
        """The image's bytes under ``images/``, once per sha256; where they are, relative to the folder."""
        relative = f"{IMAGES}/{sha256[:2]}/{sha256}"
        if not self.has(relative):
            self.write(relative, data)
        return relative

    def segments(self) -> list[str]:
        """The published segments' names, oldest first."""
        if self.on_s3:
            names = list_s3_names(self.location.rstrip("/") + f"/{ANSWERS}/")
        else:
            folder = Path(self.location) / ANSWERS
            names = [path.name for path in folder.iterdir()] if folder.is_dir() else []
        return sorted((name for name in names if SEGMENT.match(name)), key=lambda name: (segment_time(name), name))

    def read_segment(self, name: str) -> bytes:
        if self.on_s3:
            data = read_s3_object(self.location.rstrip("/") + f"/{ANSWERS}/{name}")
            if data is None:
                raise FileNotFoundError(name)
            return data
        return (Path(self.location) / ANSWERS / name).read_bytes()

    def sizes(self) -> list[tuple[str, int]]:
        """(segment, bytes) of a local folder, oldest first (``--record-max-gb`` bounds their sum)."""
        return [(name, (Path(self.location) / ANSWERS / name).stat().st_size) for name in self.segments()]

    def remove(self, name: str) -> None:
        (Path(self.location) / ANSWERS / name).unlink(missing_ok=True)


@dataclass
class Window:
    """The records read for a window, and what was left out of it."""

    records: pd.DataFrame
    damaged: dict[str, str]  # segment -> why it was skipped
    other_models: int  # records of another model, left out


def check_record_folder(location: str) -> None:
    """A local record folder must exist (an S3 prefix is listed as it is)."""
    if not is_s3_uri(location) and not Path(location).is_dir():
        raise PipelineInputError(f"{location}: no such folder of records (give the folder serve --record writes to)")


def read_records(location: str, model: str | None = None, since: dt.datetime | None = None) -> Window:
    """Every record at ``location`` from ``since`` on (of ``model`` only, when given), in time order. A segment that
    cannot be read whole is skipped and named; nothing is modified."""
    check_record_folder(location)
    folder = RecordFolder(location)
    frames, damaged = [], {}
    for name in folder.segments():
        started = segment_time(name)
        if since is not None and started is not None and started < since - dt.timedelta(hours=1):
            continue  # a segment holds at most an hour's records (the recorder publishes sooner)
        try:
            lines = gzip.decompress(folder.read_segment(name)).decode().splitlines()
            frames.append(pd.DataFrame([json.loads(line) for line in lines], columns=list(COLUMNS)))
        except (OSError, EOFError, ValueError, UnicodeDecodeError) as error:
            damaged[name] = f"{type(error).__name__}: {error}"
    records = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
    records["time"] = pd.to_datetime(records["time"], utc=True)
    if since is not None:
        records = records[records["time"] >= pd.Timestamp(since)]
    other = 0
    if model is not None:
        mine = records["model"] == model
        other, records = int((~mine).sum()), records[mine]
    return Window(records.sort_values("time", kind="stable").reset_index(drop=True), damaged, other)
