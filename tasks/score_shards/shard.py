"""One shard of a sharded scoring, on the host that runs it: the model and the shard's images fetched (only its
range of an ImageDirectory on S3, each image checked against its manifest's sha256), its rows scored, its part of
the table and then its summary written (tasks/score_shards/parts.py). An image that cannot be read or decoded,
or that differs from the sha256 recorded when it was converted, becomes a row without scores."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from botocore.exceptions import ClientError

from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.scores_table import BATCH_SIZE, Runtime, write_score_chunks
from tasks.evaluation.score import DecodeOn, Span, score_chunks
from tasks.score_shards.parts import FailedImage, PartSummary, ShardRange, write_summary
from tasks.storage.local_files import sha256_file
from tasks.storage.s3 import download_s3_object, is_s3_uri, no_such_key, parse_s3_uri, s3_client
from tasks.storage.work_dir_on_s3 import fetch_folder
from tasks.work_dir.images import fetch_index, stored_manifest

DOWNLOAD_THREADS = 16


def fetch_image_span(location: str, start: int, stop: int) -> tuple[ImageDirectory, dict[int, str]]:
    """The ImageDirectory at ``location`` with the images of index rows ``start`` to ``stop`` on this host, and
    those of them that could not be had (row -> why). A local one is itself, as is one this host's cache holds
    whole. From S3, its manifest, its index and the range's images only go to ``<cache>/images/<key>-ranges``
    (shards of the same images share it); an image whose bytes differ from the sha256 recorded at conversion, or
    whose object is gone, is named instead."""
    if not is_s3_uri(location):
        return ImageDirectory(location), {}
    manifest, whole = stored_manifest(location)
    if (whole / MANIFEST_NAME).is_file():  # fetched whole and checked before
        return ImageDirectory(whole), {}
    folder = whole.with_name(whole.name + "-ranges")
    images = ImageDirectory(folder) if (folder / MANIFEST_NAME).is_file() else fetch_index(location, manifest, folder)
    index, where, client = images.index, parse_s3_uri(location), s3_client()

    def fetch(row: int) -> str | None:
        path, expected = folder / index.path[row], index.sha256[row].tobytes().hex()
        if path.is_file() and sha256_file(path) == expected:
            return None
        try:
            download_s3_object(client, where.bucket, where.key(index.path[row]), path)
        except ClientError as error:  # an object gone costs its row, not the shard
            if not no_such_key(error):
                raise
            return f"{location}/{index.path[row]} is gone from the bucket"
        if sha256_file(path) != expected:
            return "its bytes differ from the sha256 recorded when it was converted (damaged since)"
        return None

    with ThreadPoolExecutor(DOWNLOAD_THREADS) as pool:
        missing = dict(zip(range(start, stop), pool.map(fetch, range(start, stop))))
    return images, {row: why for row, why in missing.items() if why}


def score_part(
    model_dir: str,
    image_dir: str,
    shard: ShardRange,
    part: str,
    runtime: Runtime = "torch",
    batch_size: int = BATCH_SIZE,
    top_k: int = 0,
    decode_on: DecodeOn | None = None,
) -> PartSummary:
    """Score index rows ``shard.start`` to ``shard.stop`` of ``image_dir`` (a path or S3 URI) with ``model_dir``
    into ``part`` (written whole), then write its summary beside it; returns the summary. ``decode_on``: as
    ``score_chunks`` takes it (the device on CUDA by default)."""
    started = time.time()
    model = ModelDirectory(fetch_folder(model_dir))
    images, unreadable = fetch_image_span(image_dir, shard.start, shard.stop)
    span = Span(shard.start, shard.stop, failed=dict(unreadable))
    options = {"batch_size": batch_size, "runtime": runtime, "top_k": top_k, "decode_on": decode_on}
    chunks = score_chunks(model, images, **options, span=span)
    scores = write_score_chunks(chunks, part, rows=shard.stop - shard.start)
    index = images.index
    summary = PartSummary(
        shard=shard.shard,
        start=shard.start,
        stop=shard.stop,
        rows=scores.rows,
        failed=[
            FailedImage(row=row, image=index.source_path[row] or index.path[row], error=why)
            for row, why in sorted(span.failed.items())
        ],
        label_counts=dict(scores.counts),
        top_probability_sum=scores.top_probabilities,
        started_at=started,
        first_image_at=span.first_at,
        seconds=time.time() - started,
    )
    write_summary(summary, part)
    return summary
