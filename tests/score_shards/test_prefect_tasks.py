"""tasks/score_shards/prefect_tasks.py's plain parts: what a failed shard's error says (the runs themselves:
tests/flows/test_score_shards.py)."""

from types import SimpleNamespace

from tasks.errors import RunFailedError
from tasks.score_shards.parts import ShardRange
from tasks.score_shards.prefect_tasks import shard_failed


def test_a_failed_shard_names_its_index_rows_its_last_run_and_that_runs_last_message():
    run = SimpleNamespace(name="fuzzy-lemur-shard-1-rerun-2")
    error = shard_failed(
        ShardRange(shard=1, start=4, stop=6),
        run,
        "ran past its timeout of 0.5 s: cancelled, and was run 2 times again",
        "said",
    )
    assert str(error) == (
        "shard 1 (index rows 4-6): flow run 'fuzzy-lemur-shard-1-rerun-2' ran past its timeout of 0.5 s: cancelled, "
        "and was run 2 times again; its last message: said"
    )
    assert isinstance(error, RunFailedError), "the command line tells it in one line, exit status 1"
