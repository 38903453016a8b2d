"""The pipeline's errors: a training's failure carries the failing rank's log tail, and each error says by its
type whether it is the user's to fix (told in one line, exit 2, never retried) or a run that failed (exit 1)."""

import pytest

from tasks.errors import (
    FailedImagesError,
    InvalidDatasetError,
    ModelNotFoundError,
    OutputStorageError,
    PipelineInputError,
    RunFailedError,
    ShardFailedError,
    TrainingDivergedError,
    TrainingFailedError,
    TrainingTimeoutError,
)


def test_a_failed_training_says_which_rank_failed_and_shows_the_end_of_its_log():
    error = TrainingFailedError("torchrun exited with 1", returncode=1, rank=1, log_tail="CUDA out of memory")
    assert str(error) == "torchrun exited with 1\n--- log tail (rank 1) ---\nCUDA out of memory"
    assert (error.returncode, error.rank, error.log_tail) == (1, 1, "CUDA out of memory")
    unknown = TrainingTimeoutError("stopped after 3600 s", returncode=None, rank=None, log_tail="epoch 3")
    assert "--- log tail (rank ?) ---" in str(unknown)


@pytest.mark.parametrize(
    ("error", "users_to_fix", "a_failed_run"),
    [
        (InvalidDatasetError("train has no images"), True, False),
        (ModelNotFoundError("no model named colours"), True, False),
        (FailedImagesError("3 images could not be read"), True, False),
        # Diverged: the run failed, and no retry helps: a lower learning rate does.
        (TrainingDivergedError("loss is nan", returncode=1, rank=0, log_tail=""), True, True),
        (OutputStorageError("the bucket refused the write"), True, True),
        (TrainingFailedError("torchrun exited with 1", returncode=1, rank=0, log_tail=""), False, True),
        (ShardFailedError("shard 2 crashed twice"), False, True),
    ],
)
def test_each_error_says_whether_the_user_fixes_it_or_a_run_failed(error, users_to_fix, a_failed_run):
    assert isinstance(error, PipelineInputError) is users_to_fix
    assert isinstance(error, RunFailedError) is a_failed_run
