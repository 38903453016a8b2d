import pytest


def test_s3_refusing_a_write_is_a_storage_error_naming_the_object_and_not_retried(s3_bucket):
    import pandas as pd

    from tasks.contracts.scores_table import write_scores
    from tasks.errors import OutputStorageError, PipelineInputError
    from tasks.registry.s3 import S3Backend

    missing = f"{s3_bucket}-gone"
    with pytest.raises(OutputStorageError, match=rf"^S3 refused to store s3://{missing}/scores.csv: NoSuchBucket"):
        write_scores(pd.DataFrame({"image": ["a.png"]}), f"s3://{missing}/scores.csv")
    # The registry's exclusive create (a claim) answers 404 for a missing bucket too: a refusal, not a lost race.
    with pytest.raises(OutputStorageError, match=rf"^S3 refused to store s3://{missing}/reg/m/1/"):
        S3Backend(f"s3://{missing}/reg").create_exclusive("m/1/claim.json", b"{}")
    assert issubclass(OutputStorageError, PipelineInputError)  # the stage's retry rule leaves it alone
