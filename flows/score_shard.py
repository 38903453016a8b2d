"""One shard of a sharded scoring: the ``score-shard`` deployment (deployments/prefect.yaml, work pool ``gpu``;
``score-shard-default`` on the ``default`` pool).

The score flow (flows/score.py with shards > 1) submits one run per range of the images' index, and runs a
shard again, with ``replaces_run``, when its run crashed or ran past its timeout; not meant to be run by hand.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from tasks.contracts.scores_table import BATCH_SIZE, Runtime
from tasks.score_shards.parts import PartSummary, ShardRange


@flow(name="score-shard", log_prints=True)
def score_shard_flow(
    model_dir: str,
    image_dir: str,
    shard: ShardRange,
    run_dir: str,
    runtime: Runtime = "torch",
    batch_size: int = BATCH_SIZE,
    top_k: int = 0,
    replaces_run: str | None = None,
) -> PartSummary:
    """Score one range of an ImageDirectory's index into the scoring run's part of the table for it.

    Args:
        model_dir: The ModelDirectory (a path or S3 URI) that scores.
        image_dir: The converted ImageDirectory (a path or S3 URI); only the shard's images are fetched from S3.
        shard: The shard's number and its index rows (start, stop).
        run_dir: The scoring's run folder: the part goes to parts/part-NNN.csv in it, written whole.
        runtime: 'torch', or 'onnx' for a model registered with its model.onnx.
        batch_size: Images per forward pass.
        top_k: Also list each image's k most probable labels; 0: none.
        replaces_run: Set by the scoring when it runs a crashed or timed-out shard again: that run's id.
    """
    from tasks.score_shards.prefect_tasks import score_shard  # here: torch, which only the shard's host needs

    if replaces_run:
        get_run_logger().info(f"replaces flow run {replaces_run}: shard {shard.shard} scored anew, its part rewritten")
    return score_shard(model_dir, image_dir, shard, run_dir, runtime, batch_size, top_k)
