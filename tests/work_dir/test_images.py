"""An ImageDirectory stored on S3 once and fetched into a content-keyed cache (tasks/work_dir/images.py), against a
real HTTP S3 endpoint (moto's server), checked against its manifest; the store task around it."""

import shutil

import pytest

from tasks.errors import InvalidDatasetError, InvalidStorageURIError
from tasks.storage.s3 import list_s3_names, s3_client
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE
from tasks.work_dir.images import fetch_image_directory, publish


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_an_image_directory_is_stored_once_and_each_host_fetches_it_once(s3_bucket, cache, colour_image_dirs):
    train, _ = colour_image_dirs
    location = f"s3://{s3_bucket}/run/data/train"
    assert publish(train, location) == location
    stored = list_s3_names(location)
    assert "image_directory.json" in stored and len(stored) == 2 + 3 * 8  # the manifest, its index, 24 images
    client = s3_client()
    tag = client.head_object(Bucket=s3_bucket, Key="run/data/train/image_directory.json")["ETag"]
    publish(train, location)  # the same manifest is there: nothing is uploaded again
    assert client.head_object(Bucket=s3_bucket, Key="run/data/train/image_directory.json")["ETag"] == tag

    fetched = fetch_image_directory(location)
    assert (
        fetched.parent == cache / "images"
        and (fetched / "image_directory.json").read_bytes() == (train / "image_directory.json").read_bytes()
    )
    image = next(p for p in fetched.rglob("*.png"))
    image.write_bytes(b"changed here")  # a cache hit downloads nothing, so this stays
    assert fetch_image_directory(location) == fetched and image.read_bytes() == b"changed here"
    assert fetch_image_directory(str(train)) == train  # a path is used in place

    # The manifest names each index file's sha256: a changed index is refused, as a changed image is.
    shutil.rmtree(fetched)
    client.put_object(Bucket=s3_bucket, Key="run/data/train/image_index.npz", Body=b"changed there")
    with pytest.raises(InvalidDatasetError, match="its image_index.npz differs from the sha256 its manifest gives"):
        fetch_image_directory(location)


def test_an_image_that_differs_from_its_manifest_is_refused(s3_bucket, cache, colour_image_dirs):
    train, _ = colour_image_dirs
    location = f"s3://{s3_bucket}/run/data/train"
    publish(train, location)
    s3_client().put_object(Bucket=s3_bucket, Key="run/data/train/red/red_0.png", Body=b"not the image")
    with pytest.raises(InvalidDatasetError, match="1 images differ from their manifest's sha256, e.g. red/red_0.png"):
        fetch_image_directory(location)
    assert not list((cache / "images").iterdir()), "nothing half fetched is left in the cache"


def test_store_does_not_retry_a_bad_location(prefect_server, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client

    from tasks.work_dir.prefect_tasks import store

    folder = tmp_path / "data"
    folder.mkdir()

    @flow
    def store_once():
        state = store(str(folder), "s3://", return_state=True)
        with pytest.raises(InvalidStorageURIError, match="names no bucket"):
            state.result()
        return state.state_details.task_run_id

    with get_client(sync_client=True) as client:
        assert client.read_task_run(store_once()).run_count == 1, "a mistake in the location is not retried"
