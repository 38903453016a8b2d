"""A training's output kept in step with its S3 folder (tasks/work_dir/training_output.py), against a real HTTP S3
endpoint (moto's server): the host ahead uploads, a host behind downloads, a retried node starts from the upload."""

from tasks.contracts.model_directory import EpochMetrics, TrainingMetrics
from tasks.contracts.training_config import TrainingFolders
from tasks.storage.local_files import write_text_atomic
from tasks.storage.s3 import list_s3_names, parse_s3_uri, read_s3_object, s3_client
from tasks.storage.work_dir_on_s3 import CACHE_VARIABLE
from tasks.work_dir.training_output import OutputMirror, stage_training


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


def test_a_file_unchanged_since_this_host_uploaded_it_is_not_sent_again(s3_bucket, tmp_path, monkeypatch):
    """The best weights stay as they are for epochs at a time: each look uploads only the files written since its
    last upload, until another host has stored epochs in between. (An object changed behind the mirror's back shows
    which files were sent.)"""
    output = f"s3://{s3_bucket}/run/model"
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "a"))
    a = OutputMirror(output)
    monkeypatch.setenv(CACHE_VARIABLE, str(tmp_path / "b"))
    b = OutputMirror(output)
    where = parse_s3_uri(output)

    def epoch(mirror: OutputMirror, number: int, *names: str) -> None:
        for name in names:
            write_text_atomic(mirror.local / name, f"{name} of epoch {number}")
        write_text_atomic(mirror.local / "metrics.json", metrics(number))

    def marked() -> None:
        s3_client().put_object(Bucket=where.bucket, Key=where.key("model.pt"), Body=b"not sent again")

    (a.local / "checkpoints").mkdir(parents=True)
    epoch(a, 1, "checkpoints/last.pt", "model.pt", "model_spec.json")
    a.sync()
    marked()
    epoch(a, 2, "checkpoints/last.pt")  # no better epoch: the best weights stay
    a.sync()
    assert read_s3_object(f"{output}/model.pt") == b"not sent again"
    assert read_s3_object(f"{output}/checkpoints/last.pt") == b"checkpoints/last.pt of epoch 2"
    epoch(a, 3, "checkpoints/last.pt", "model.pt")
    a.sync()
    assert read_s3_object(f"{output}/model.pt") == b"model.pt of epoch 3"

    b.sync()  # b takes epoch 3, then stores epoch 4 as rank 0
    epoch(b, 4, "checkpoints/last.pt")
    b.sync()
    marked()
    epoch(a, 5, "checkpoints/last.pt")  # a ahead again: everything it holds is sent
    a.sync()
    assert read_s3_object(f"{output}/model.pt") == b"model.pt of epoch 3"
