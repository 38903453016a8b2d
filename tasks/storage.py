"""Storage locations: plain paths and ``s3://bucket/prefix`` URIs, and the one way this project makes S3 clients.

S3 goes through boto3 with an explicit retry configuration (standard mode: 5xx, throttling and connection
errors are retried with backoff). ``AWS_ENDPOINT_URL`` selects a non-AWS endpoint (MinIO, Ceph, moto);
credentials come from boto3's usual chain (environment, ~/.aws, instance roles).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

S3_SCHEME = "s3://"
RETRY_ATTEMPTS = 10


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # without leading or trailing "/"; "" for the whole bucket

    def key(self, *parts: str) -> str:
        """The object key of ``parts`` below this prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}".rstrip("/")


def is_s3_uri(location: str | os.PathLike[str]) -> bool:
    return str(location).startswith(S3_SCHEME)


def parse_s3_uri(uri: str) -> S3Location:
    """``s3://bucket/some/prefix/`` -> S3Location("bucket", "some/prefix")."""
    if not is_s3_uri(uri):
        raise ValueError(f"{uri!r} is not an S3 URI: expected s3://bucket/prefix")
    bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket: expected s3://bucket/prefix")
    return S3Location(bucket=bucket, prefix=prefix.strip("/"))


def read_bytes(location: str | os.PathLike[str]) -> bytes:
    """A small file's bytes from a local path or an ``s3://bucket/key``."""
    if is_s3_uri(location):
        where = parse_s3_uri(str(location))
        return s3_client().get_object(Bucket=where.bucket, Key=where.prefix)["Body"].read()
    with open(location, "rb") as handle:
        return handle.read()


def s3_client(max_attempts: int = RETRY_ATTEMPTS):
    """A boto3 S3 client with standard-mode retries; honours ``AWS_ENDPOINT_URL``."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=10, read_timeout=60)
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None, config=config)
