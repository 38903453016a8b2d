"""The Prefect side of sharded scoring: the ``score_shard`` task (one shard on its host, tasks/score_shards/shard.py),
and the scoring's fan-out through the work pool: each range of the index is one flow run of the ``score-shard``
deployment (flows/score_shard.py; pool ``gpu``, or ``default`` through ``score-shard-default``), submitted through
the scoring's own work queue; the pool's workers take them, one per host at a time as their limits say.

The shard runs go through the fan-out engine (tasks/fanout/engine.py), which looks at them every few seconds and
hands each look to ``run_shards``' loop. A completed shard's part is read back (its summary); a crashed one (its host or worker lost: the lost-host
automation or the worker sets it Crashed) and one that ran past ``timeout_s`` (cancelled through the API) are run
again by the engine through the same queue, at most ``MAX_RERUNS`` times, writing their part anew; one that
failed (its own retries spent), or whose re-runs are spent, fails the scoring. Shards whose part is
complete are not scored again when the scoring is retried. The live ``scoring`` artifact shows shards done,
images scored, images per second and images that could not be scored. Then the parts are merged into one table.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import PurePosixPath

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.scores_table import BATCH_SIZE, Runtime
from tasks.errors import ShardFailedError
from tasks.evaluation.prefect_tasks import PREVIEW_ROWS, Scored, publish_scores
from tasks.fanout.decisions import RerunRule, Verdict
from tasks.fanout.engine import Child, FanOut
from tasks.retrying import stage_task
from tasks.score_shards.parts import (
    DEFAULT_TIMEOUT_S,
    SHARD_DEPLOYMENTS,
    PartSummary,
    ShardPool,
    ShardRange,
    check_failures,
    combined_summary,
    merge_parts,
    part_location,
    read_summary,
    shard_ranges,
)
from tasks.storage.work_dir_on_s3 import join
from tasks.work_dir.prefect_tasks import store


class Progress:
    """The live ``scoring`` artifact: a row per shard; shards done, images scored, images/s, failed images."""

    def __init__(self, ranges: list[ShardRange], summaries: dict[int, PartSummary]) -> None:
        self.ranges, self.summaries, self.started = ranges, summaries, time.monotonic()
        self.states: dict[int, str] = {r.shard: "done before" for r in ranges if r.shard in summaries}

    def follow(self, children: Sequence[Child]) -> None:
        """Each shard's run state as the last look found it (a re-run's included), but for the parts read back."""
        for child in children:
            if child.key not in self.summaries:
                self.states[child.key] = (
                    "run again" if child.reruns and child.state_name == "Scheduled" else child.state_name.lower()
                )
        self.publish()

    def publish(self) -> None:
        done = [self.summaries[r.shard] for r in self.ranges if r.shard in self.summaries]
        images, failed = sum(s.rows for s in done), sum(len(s.failed) for s in done)
        rate = images / max(time.monotonic() - self.started, 1e-9)
        rows = [
            {
                "shard": r.shard,
                "index rows": f"{r.start}-{r.stop}",
                "state": self.states.get(r.shard, "waiting"),
                "images": self.summaries[r.shard].rows if r.shard in self.summaries else 0,
                "failed images": len(self.summaries[r.shard].failed) if r.shard in self.summaries else 0,
                "seconds": round(self.summaries[r.shard].seconds, 1) if r.shard in self.summaries else None,
            }
            for r in self.ranges
        ]
        create_table_artifact(
            key="scoring",
            table=rows,
            description=f"{len(done)} of {len(self.ranges)} shards done; {images} images scored "
            f"({rate:.0f} images/s); {failed} failed image{'' if failed == 1 else 's'}",
        )


def run_shards(
    ranges: list[ShardRange],
    arguments: dict,
    run_dir: str,
    *,
    pool: ShardPool = "gpu",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_seconds: float = 2.0,
) -> list[PartSummary]:
    """Score each of ``ranges`` as a run of the pool's shard deployment with ``arguments`` (model_dir, image_dir,
    run_dir, runtime, batch_size, top_k), through the fan-out engine (a crashed or timed-out shard run again at
    most MAX_RERUNS times), until every part is complete; returns the parts' summaries in order. Parts already
    complete (a retried scoring) are kept."""
    log, ranged = get_run_logger().log, {r.shard: r for r in ranges}
    parts = {r.shard: part_location(run_dir, r.shard) for r in ranges}
    summaries: dict[int, PartSummary] = {}
    for r in ranges:
        if (found := read_summary(parts[r.shard])) and (found.start, found.stop) == (r.start, r.stop):
            summaries[r.shard] = found
    progress = Progress(ranges, summaries)
    queue = PurePosixPath(run_dir.rstrip("/")).name
    fan = FanOut(
        SHARD_DEPLOYMENTS[pool],
        label="shard",
        what="sharded scoring runs each shard",
        queue=queue,
        rule=RerunRule(timeout_s=timeout_s),
        cancel_message="cancelled with its scoring",
        poll_seconds=poll_seconds,
    )
    with fan:
        for shard in (r for r in ranges if r.shard not in summaries):
            fan.submit(shard.shard, {**arguments, "shard": shard.model_dump()})
        log(logging.INFO, f"{len(fan.children)} shards submitted to work queue {queue!r} of pool {fan.pool!r}")
        progress.follow(list(fan.children.values()))
        for look in fan.looks():
            for child in look.ended:
                if child.decision.verdict is Verdict.COMPLETED and (summary := read_summary(parts[child.key])):
                    summaries[child.key], progress.states[child.key] = summary, "done"
            if look.changed:
                progress.follow(look.children)
            for child in look.ended:
                if child.key not in summaries:  # failed, cancelled by someone, its re-runs spent, or no part
                    raise ended_without_part(fan, child, ranged[child.key], parts[child.key])
    return [summaries[r.shard] for r in ranges]


def ended_without_part(fan: FanOut, child: Child, shard: ShardRange, part: str) -> ShardFailedError:
    """The error for a shard settled without its part: its run failed, was cancelled or ran out of re-runs, or
    completed but wrote no ``part``."""
    if child.decision.verdict is Verdict.COMPLETED:
        return shard_failed(shard, child.run, f"completed but wrote no {part}", fan.last_message(child))
    return shard_failed(shard, child.run, child.decision.why, child.said)


def shard_failed(shard: ShardRange, run, what: str, message: str) -> ShardFailedError:
    """The error for a shard whose flow ``run`` ``what`` (ended Failed, ran past its timeout…): the shard, its index
    rows, the run and the run's last ``message``."""
    return ShardFailedError(
        f"shard {shard.shard} (index rows {shard.start}-{shard.stop}): flow run {run.name!r} {what}; its last "
        f"message: {message}"
    )


@stage_task
def score_shard(
    model_dir: str,
    image_dir: str,
    shard: ShardRange,
    run_dir: str,
    runtime: Runtime = "torch",
    batch_size: int = BATCH_SIZE,
    top_k: int = 0,
) -> PartSummary:
    """``score_part`` into the run's part for ``shard``, logged: a run of it again writes the part anew (never
    adds rows)."""
    logger, part = get_run_logger(), part_location(run_dir, shard.shard)
    logger.info(f"shard {shard.shard}: index rows {shard.start} to {shard.stop} of {image_dir} (pid {os.getpid()})")
    from tasks.score_shards.shard import score_part  # torch: in the shard's process, not the scoring's

    summary = score_part(model_dir, image_dir, shard, part, runtime, batch_size, top_k)
    rate = summary.rows / max(summary.seconds, 1e-9)
    logger.info(
        f"shard {shard.shard}: {summary.rows} images in {summary.seconds:.1f} s ({rate:.0f} images/s), "
        f"{len(summary.failed)} without scores -> {part}"
    )
    for failed in summary.failed:
        logger.warning(f"shard {shard.shard}: {failed.image} not scored: {failed.error}")
    return summary


@stage_task
def merge_scores(
    summaries: list[PartSummary],
    run_dir: str,
    output_csv: str,
    max_failed_images: int,
    runtime: Runtime,
    started: float,
) -> Scored:
    """The parts as one table at ``output_csv``, once the images that could not be scored are within
    ``max_failed_images``; artifact ``scores`` as a one-process scoring gives it (``started``: when the scoring
    began, by ``time.time()``)."""
    merging = time.perf_counter()
    failed = check_failures(summaries, max_failed_images)
    parts = [part_location(run_dir, summary.shard) for summary in summaries]
    merge_parts(parts, summaries, output_csv)
    logger = get_run_logger()
    logger.info(f"{len(parts)} parts merged into {output_csv} in {time.perf_counter() - merging:.3f} s")
    if failed:
        logger.warning(f"{len(failed)} images have no scores (the table's 'error' column says why)")
    summary = combined_summary(summaries, parts[0], PREVIEW_ROWS)
    return publish_scores(summary, time.time() - started, f"{runtime} fp32", output_csv)


def score_in_shards(
    model_dir: str,
    image_dir: str,
    run_dir: str,
    output_csv: str,
    *,
    shards: int,
    pool: ShardPool,
    runtime: Runtime,
    batch_size: int,
    top_k: int,
    max_failed_images: int,
    timeout_s: float,
) -> Scored:
    """Score ``image_dir`` with ``model_dir`` in ``shards`` ranges over the pool into one table at ``output_csv``.
    With the run folder on S3 the images and the model are stored there first, for the shards' hosts."""
    started = time.time()
    ranges = shard_ranges(len(ImageDirectory(image_dir)), shards, batch_size)
    if len(ranges) < shards:
        get_run_logger().info(f"{len(ranges)} shards: the images make only {len(ranges)} batches of {batch_size}")
    arguments = {
        "model_dir": store(model_dir, join(run_dir, "model")),
        "image_dir": store(image_dir, join(run_dir, "images")),
        "runtime": runtime,
        "batch_size": batch_size,
        "top_k": top_k,
        "run_dir": run_dir,
    }
    summaries = run_shards(ranges, arguments, run_dir, pool=pool, timeout_s=timeout_s)
    return merge_scores(summaries, run_dir, output_csv, max_failed_images, runtime, started)
