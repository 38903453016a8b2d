import os
from pathlib import Path

import pytest

from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError
from tasks.storage.s3 import s3_client
from tests.convert.sample_sources import tar_bytes
from tests.faulty_proxy import FaultyProxy
from tests.helpers import COLOURS, write_class_folders, write_image


def upload(folder: Path, bucket: str, prefix: str) -> None:
    client = s3_client()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(folder).as_posix()}")


def test_s3_prefix_is_streamed_into_an_image_directory_and_reused_while_unchanged(s3_bucket, tmp_path):
    write_class_folders(tmp_path / "train", 3)
    upload(tmp_path / "train", s3_bucket, "datasets/colours/train")
    client = s3_client()
    client.put_object(Bucket=s3_bucket, Key="datasets/colours/train/.DS_Store", Body=b"junk")
    client.put_object(Bucket=s3_bucket, Key="datasets/colours/train-old/red/x.png", Body=b"not this prefix")
    uri = f"s3://{s3_bucket}/datasets/colours/train/"

    image_dir = convert_to_image_directory(uri, tmp_path / "out")
    assert image_dir.manifest.counts == {c: 3 for c in COLOURS} and image_dir.manifest.quarantined == []
    assert image_dir.manifest.source == uri
    inode = (tmp_path / "out").stat().st_ino
    assert convert_to_image_directory(uri, tmp_path / "out").manifest == image_dir.manifest
    assert (tmp_path / "out").stat().st_ino == inode, "an unchanged prefix is not downloaded again"

    client.put_object(Bucket=s3_bucket, Key="datasets/colours/train/red/red_0.png", Body=b"overwritten: not an image")
    changed = convert_to_image_directory(uri, tmp_path / "out")
    assert changed.manifest.counts["red"] == 2 and [q.path for q in changed.manifest.quarantined] == ["red/red_0.png"]
    assert client.get_object(Bucket=s3_bucket, Key="datasets/colours/train/.DS_Store")["Body"].read() == b"junk"


def test_s3_prefix_changed_between_its_listing_and_its_download_is_refused(s3_bucket, tmp_path):
    from tasks.convert.locations import open_source

    write_class_folders(tmp_path / "train", 2)
    upload(tmp_path / "train", s3_bucket, "moving")
    source = open_source(f"s3://{s3_bucket}/moving")
    assert source.survey.count == 6 and source.fingerprint() == source.survey.digest  # listed once, page by page
    s3_client().put_object(Bucket=s3_bucket, Key="moving/red/late.png", Body=b"added after the listing")
    with pytest.raises(InvalidDatasetError, match="changed while it was read"), source.open():
        pass


def test_s3_prefix_follows_the_folder_rules_for_hidden_entries(s3_bucket, tmp_path):
    write_class_folders(tmp_path / "train", 2)
    (tmp_path / "train" / "red").rename(tmp_path / "train" / ".net")
    write_image(tmp_path / "train" / "blue" / ".secret.png", COLOURS["blue"], seed=60)
    upload(tmp_path / "train", s3_bucket, "hidden/train")

    image_dir = convert_to_image_directory(f"s3://{s3_bucket}/hidden/train", tmp_path / "out")
    assert image_dir.classes == [".net", "blue", "green"] and image_dir.manifest.counts[".net"] == 2
    assert {q.path: q.reason for q in image_dir.manifest.quarantined} == {
        "blue/.secret.png": "hidden file (its name starts with '.'): skipped"
    }


def test_s3_archive_object_and_s3_labels_file(s3_bucket, colour_source, tmp_path):
    client = s3_client()
    client.put_object(Bucket=s3_bucket, Key="archives/colours.tar.gz", Body=tar_bytes(colour_source, "photos", "w:gz"))
    image_dir = convert_to_image_directory(f"s3://{s3_bucket}/archives/colours.tar.gz", tmp_path / "from-archive")
    assert image_dir.manifest.counts == {c: 6 for c in COLOURS}

    for path in sorted((colour_source / "red").iterdir())[:2] + sorted((colour_source / "blue").iterdir())[:2]:
        client.upload_file(str(path), s3_bucket, f"flat/{path.name}")
    client.put_object(
        Bucket=s3_bucket,
        Key="meta/labels.csv",
        Body=b"image,label\nred_0.png,warm\nred_1.png,warm\nblue_0.png,cold\nblue_1.png,cold\n",
    )
    labeled = convert_to_image_directory(
        f"s3://{s3_bucket}/flat", tmp_path / "from-labels", labels=f"s3://{s3_bucket}/meta/labels.csv"
    )
    assert labeled.manifest.counts == {"cold": 2, "warm": 2}


def test_s3_missing_bucket_empty_prefix_and_oversized_prefix_are_refused(s3_bucket, tmp_path):
    with pytest.raises(InvalidDatasetError, match="bucket 'no-such-bucket' does not exist"):
        convert_to_image_directory("s3://no-such-bucket/train", tmp_path / "out")
    with pytest.raises(InvalidDatasetError, match="holds no objects"):
        convert_to_image_directory(f"s3://{s3_bucket}/nothing-here", tmp_path / "out")
    s3_client().put_object(Bucket=s3_bucket, Key="big/cats/a.png", Body=os.urandom(4096))
    with pytest.raises(InvalidDatasetError, match="over the limit of 1,024 bytes"):
        convert_to_image_directory(f"s3://{s3_bucket}/big", tmp_path / "out", max_extracted_bytes=1024)


def test_s3_conversion_reads_again_the_bodies_cut_off_mid_way(s3_bucket, s3_endpoint, tmp_path, monkeypatch):
    write_class_folders(tmp_path / "train", 6)
    upload(tmp_path / "train", s3_bucket, "cut/train")
    with FaultyProxy(s3_endpoint, failure_rate=0.0, cut_rate=0.3, seed=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        image_dir = convert_to_image_directory(f"s3://{s3_bucket}/cut/train", tmp_path / "out")
    assert image_dir.manifest.counts == {c: 6 for c in COLOURS} and image_dir.manifest.quarantined == []
    assert proxy.counts["cut"] >= 2, proxy.counts


def test_s3_keys_that_cannot_be_files_are_skipped_and_reported(s3_bucket, tmp_path, scratch):
    write_class_folders(tmp_path / "train", 3)
    upload(tmp_path / "train", s3_bucket, "odd/train")
    client = s3_client()
    png = (tmp_path / "train" / "red" / "red_0.png").read_bytes()
    for key in (
        "odd/train/red/../../../escaped.png",
        "odd/train/blue/./dot.png",
        "odd/train/green//twice.png",
        "odd/train/red",
    ):
        client.put_object(Bucket=s3_bucket, Key=key, Body=png)

    image_dir = convert_to_image_directory(f"s3://{s3_bucket}/odd/train", tmp_path / "out")
    assert image_dir.manifest.counts == {c: 3 for c in COLOURS}
    reasons = {q.path: q.reason for q in image_dir.manifest.quarantined}
    assert set(reasons) == {"red/../../../escaped.png", "blue/./dot.png", "green//twice.png", "red"}
    assert "could land outside the folder" in reasons["red/../../../escaped.png"]
    assert "also the folder of 'red/red_" in reasons["red"]
    assert not list(tmp_path.rglob("escaped.png")) and not list(scratch.iterdir())


def test_s3_prefix_of_only_unusable_keys_says_what_was_skipped(s3_bucket, tmp_path):
    s3_client().put_object(Bucket=s3_bucket, Key="bad/../x.png", Body=b"x")
    with pytest.raises(InvalidDatasetError, match=r"holds no objects it can read \(skipped '\.\./x\.png': its key"):
        convert_to_image_directory(f"s3://{s3_bucket}/bad", tmp_path / "out")
