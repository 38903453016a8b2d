import pytest

from tasks.storage import parse_s3_uri, s3_client


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
