"""Scoring in shards over the pool: the index of an ImageDirectory cut into contiguous ranges, each scored by a
run of the ``score-shard`` deployment into its own part of the table, the parts merged into one table equal to
the one-process scoring's. ``parts`` (no torch, no Prefect): the ranges, the parts and their merge; ``shard``: one
shard scored on its host (torch); ``prefect_tasks``: the ``score_shard`` and ``merge_scores`` tasks and the shard runs
submitted, watched, run again (imported by the flows, not by this package)."""

from tasks.score_shards.parts import FailedImage, PartSummary, ShardRange, merge_parts, shard_ranges

__all__ = ["FailedImage", "PartSummary", "ShardRange", "merge_parts", "shard_ranges"]
