"""A run folder's locations on S3 (tasks/storage/work_dir_on_s3.py and the S3 reads beneath it) against a real HTTP S3
endpoint (moto's server); the stage retry rule that guards every store. What needs a contract is tests/work_dir/."""

import pytest

from tasks.errors import InvalidStorageURIError
from tasks.storage.s3 import parse_s3_uri
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE, join, local_folder


def test_bad_s3_uris_are_refused_with_a_typed_error_saying_what_is_expected():
    for bad, why in (("/a/path", "is not an S3 URI"), ("s3://", "names no bucket"), ("s3://b/runs/../x", "'..' part")):
        with pytest.raises(InvalidStorageURIError, match=why):
            parse_s3_uri(bad)


def test_a_location_on_s3_is_kept_under_this_hosts_cache_and_a_path_is_itself(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    assert local_folder("s3://bucket/run/model") == tmp_path / "cache" / "s3" / "bucket" / "run" / "model"
    assert local_folder("runs/a") == local_folder(join("runs", "a"))
    assert join("s3://bucket/run/", "data", "train") == "s3://bucket/run/data/train"


def test_a_name_that_would_land_outside_the_folder_is_refused(s3_bucket, tmp_path):
    from tasks.storage.s3 import download_files

    with pytest.raises(InvalidStorageURIError, match="would land outside"):
        download_files(f"s3://{s3_bucket}/run", ["../../etc/passwd"], tmp_path)


def test_the_stage_retry_rule_retries_a_fault_and_never_a_mistake(prefect_server):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from pydantic import BaseModel, PositiveInt

    from tasks.retrying import stage_task

    class Limits(BaseModel):
        n: PositiveInt

    @stage_task(retry_delay_seconds=0)
    def fails_with(kind: str) -> None:
        if kind == "mistake":
            Limits(n=0)  # a pydantic ValidationError: the same input fails the same way
        raise ConnectionError("lost")

    @flow
    def both():
        return [fails_with(kind, return_state=True).state_details.task_run_id for kind in ("mistake", "fault")]

    with get_client(sync_client=True) as client:
        counts = [client.read_task_run(run_id).run_count for run_id in both()]
    assert counts == [1, 3], "the mistake ran once; the fault was retried twice"
