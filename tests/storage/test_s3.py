import os

import pytest

from tasks.storage.s3 import (
    BODY_ATTEMPTS,
    IncompleteBodyError,
    download_s3_object,
    parse_s3_uri,
    read_bytes,
    read_s3_bytes,
    s3_client,
)
from tests.faulty_proxy import FaultyProxy


def test_s3_uris_parse_to_bucket_and_prefix():
    location = parse_s3_uri("s3://models/team/vision/")
    assert (location.bucket, location.prefix) == ("models", "team/vision")
    assert location.key("digits", "1", "model.pt") == "team/vision/digits/1/model.pt"
    assert str(location) == "s3://models/team/vision"
    assert parse_s3_uri("s3://bare").key("a") == "a"
    for bad in ("/local/path", "s3://", "s3:///prefix"):
        with pytest.raises(ValueError):
            parse_s3_uri(bad)


def test_client_talks_to_the_loopback_endpoint_with_standard_retries(s3_bucket):
    client = s3_client()
    assert client.meta.config.retries["mode"] == "standard"
    client.put_object(Bucket=s3_bucket, Key="hello.txt", Body=b"hi")
    assert client.get_object(Bucket=s3_bucket, Key="hello.txt")["Body"].read() == b"hi"


@pytest.fixture
def objects(s3_bucket) -> dict[str, bytes]:
    """Six objects of 256 KiB, each different."""
    client = s3_client()
    stored = {f"blobs/{i}.bin": os.urandom(256 * 1024) for i in range(6)}
    for key, data in stored.items():
        client.put_object(Bucket=s3_bucket, Key=key, Body=data)
    return stored


def test_bodies_cut_off_mid_way_are_read_again(objects, s3_bucket, s3_endpoint, monkeypatch, tmp_path):
    with FaultyProxy(s3_endpoint, failure_rate=0.0, cut_rate=0.4, seed=3) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        client = s3_client()
        plain_failures = 0
        for key in objects:  # botocore's own retries stop once the headers have arrived
            try:
                client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
            except Exception:
                plain_failures += 1
        assert plain_failures > 0, proxy.counts
        for key, data in objects.items():
            assert read_s3_bytes(client, s3_bucket, key) == data
            download_s3_object(client, s3_bucket, key, tmp_path / key)
            assert (tmp_path / key).read_bytes() == data
        assert read_bytes(f"s3://{s3_bucket}/blobs/0.bin") == objects["blobs/0.bin"]
    assert proxy.counts["cut"] >= 3, proxy.counts


def test_a_body_cut_off_every_time_fails_and_leaves_no_file(objects, s3_bucket, s3_endpoint, monkeypatch, tmp_path):
    with FaultyProxy(s3_endpoint, failure_rate=0.0, cut_rate=1.0) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        with pytest.raises(
            IncompleteBodyError, match=f"s3://{s3_bucket}/blobs/1.bin: the body was cut off {BODY_ATTEMPTS} times"
        ):
            download_s3_object(s3_client(), s3_bucket, "blobs/1.bin", tmp_path / "out.bin")
    assert proxy.counts["cut"] == BODY_ATTEMPTS and list(tmp_path.iterdir()) == []
