"""A work_dir on S3 (tasks/storage/work_dir_on_s3.py) against a real HTTP S3 endpoint (moto's server): the ImageDirectory stored
once and fetched into a content-keyed cache, checked against its manifest, and a training output kept in step."""

import shutil

import pytest

from tasks.contracts.model_directory import EpochMetrics, TrainingMetrics
from tasks.contracts.training_config import TrainingFolders
from tasks.errors import InvalidDatasetError, InvalidStorageURIError
from tasks.storage.local_files import write_text_atomic
from tasks.storage.s3 import list_s3_names, parse_s3_uri, read_s3_object, s3_client
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE, OutputMirror, fetch_image_directory, publish, stage_training


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_bad_s3_uris_are_refused_with_a_typed_error_saying_what_is_expected():
    for bad, why in (("/a/path", "is not an S3 URI"), ("s3://", "names no bucket"), ("s3://b/runs/../x", "'..' part")):
        with pytest.raises(InvalidStorageURIError, match=why):
            parse_s3_uri(bad)


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


def test_a_name_that_would_land_outside_the_folder_is_refused(s3_bucket, tmp_path):
    from tasks.storage.s3 import download_files

    with pytest.raises(InvalidStorageURIError, match="would land outside"):
        download_files(f"s3://{s3_bucket}/run", ["../../etc/passwd"], tmp_path)


def test_an_image_that_differs_from_its_manifest_is_refused(s3_bucket, cache, colour_image_dirs):
    train, _ = colour_image_dirs
    location = f"s3://{s3_bucket}/run/data/train"
    publish(train, location)
    s3_client().put_object(Bucket=s3_bucket, Key="run/data/train/red/red_0.png", Body=b"not the image")
    with pytest.raises(InvalidDatasetError, match="1 images differ from their manifest's sha256, e.g. red/red_0.png"):
        fetch_image_directory(location)
    assert not list((cache / "images").iterdir()), "nothing half fetched is left in the cache"


def metrics(epochs: int) -> str:
    record = dict(lr=0.1, train_images_per_s=1, train_loss=1, train_error=0.5, val_loss=1, top1=0.5, top5=1, seconds=1)
    return TrainingMetrics(
        world_size=2, epochs=[EpochMetrics(epoch=e + 1, **record) for e in range(epochs)]
    ).model_dump_json()


def test_the_host_ahead_uploads_its_epochs_and_a_host_behind_downloads_them(s3_bucket, tmp_path, monkeypatch):
    output = f"s3://{s3_bucket}/run/model"
    hosts = {}
    for host in ("a", "b"):
        monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / host))
        hosts[host] = OutputMirror(output)
    a, b = hosts["a"], hosts["b"]
    (a.local / "checkpoints").mkdir(parents=True)
    (a.local / "checkpoints" / "last.pt").write_bytes(b"epoch 1")
    (a.local / "metrics.json").write_text(metrics(1))
    a.sync()
    assert set(list_s3_names(output)) == {"checkpoints/last.pt", "metrics.json"}
    b.sync()  # behind: takes epoch 1, checkpoint first
    assert (b.local / "checkpoints" / "last.pt").read_bytes() == b"epoch 1" and b.local_epochs() == 1
    (b.local / "checkpoints" / "last.pt").write_bytes(b"epoch 2")  # rank 0 moved to b
    (b.local / "metrics.json").write_text(metrics(2))
    (b.local / "logs").mkdir()
    (b.local / "logs" / "driver_log_0.txt").write_text("rank 0")
    b.finish()
    a.sync()
    assert (a.local / "checkpoints" / "last.pt").read_bytes() == b"epoch 2"
    assert "logs/driver_log_0.txt" in list_s3_names(output) and a.remote_metrics().epochs[-1].epoch == 2

    # A node run retried on a third host starts from what was uploaded.
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "c"))
    staged = stage_training(TrainingFolders(tmp_path, tmp_path, tmp_path, output))
    assert (staged.output_dir / "checkpoints" / "last.pt").read_bytes() == b"epoch 2"


def test_an_upload_never_announces_epochs_whose_checkpoint_it_did_not_store(s3_bucket, tmp_path, monkeypatch):
    """The training may finish epochs while a (big) checkpoint is being uploaded: the metrics.json stored after it
    announces the epochs of the moment the upload began, never newer ones (found by the lost-host test: metrics
    said epoch 3 while the stored checkpoint was epoch 1's, and the run that took over resumed after epoch 1)."""
    import tasks.storage.s3

    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "a"))
    mirror = OutputMirror(f"s3://{s3_bucket}/run/model")
    (mirror.local / "checkpoints").mkdir(parents=True)
    (mirror.local / "checkpoints" / "last.pt").write_bytes(b"epoch 1")
    (mirror.local / "metrics.json").write_text(metrics(1))
    real_client = tasks.storage.s3.s3_client

    class TrainingGoesOn:
        """A client whose checkpoint upload lasts while the training writes epoch 2 (checkpoint, then metrics)."""

        def __init__(self, *args, **kwargs):
            self.client = real_client(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.client, name)

        def put_object(self, **kwargs):
            if kwargs["Key"].endswith("last.pt"):  # written as the worker writes them: a new file renamed over
                write_text_atomic(mirror.local / "checkpoints" / "last.pt", "epoch 2")
                write_text_atomic(mirror.local / "metrics.json", metrics(2))
            return self.client.put_object(**kwargs)

    monkeypatch.setattr(tasks.storage.s3, "s3_client", TrainingGoesOn)
    mirror.sync()
    monkeypatch.setattr(tasks.storage.s3, "s3_client", real_client)
    stored = read_s3_object(f"{mirror.location}/checkpoints/last.pt")
    assert (stored, mirror.remote_metrics().epochs[-1].epoch) == (b"epoch 1", 1)
    mirror.sync()  # the next look stores epoch 2, checkpoint first
    stored = read_s3_object(f"{mirror.location}/checkpoints/last.pt")
    assert (stored, mirror.remote_metrics().epochs[-1].epoch) == (b"epoch 2", 2)


def test_store_does_not_retry_a_bad_location(prefect_server, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client

    from tasks.storage.prefect_tasks import store

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
