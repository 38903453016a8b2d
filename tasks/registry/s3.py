"""The registry on S3 (or any S3 endpoint: ``AWS_ENDPOINT_URL``), through ``tasks.storage.s3_client``.

Exclusive creates are conditional writes, ``put_object(IfNoneMatch="*")``: S3 answers 412 when the key
exists and 409 when another conditional write of the same key is in flight (then we ask again). Transient
failures (5xx, throttling, dropped connections) are retried by the client's standard retry mode.
"""

from __future__ import annotations

import time
from pathlib import Path

from botocore.exceptions import ClientError

from tasks.fileio import atomic_write
from tasks.registry.backends import RegistryBackend
from tasks.storage import parse_s3_uri, s3_client

CONFLICT_RETRIES = 20
_CHUNK = 1 << 20


def _status(error: ClientError) -> int:
    return error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


class S3Backend(RegistryBackend):
    def __init__(self, uri: str) -> None:
        self.root = parse_s3_uri(uri)
        self.location = str(self.root)
        self.client = s3_client()

    def create_exclusive(self, key: str, data: bytes) -> bool:
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=data, IfNoneMatch="*")
                return True
            except ClientError as error:
                if _status(error) == 412:
                    return False
                if _status(error) != 409:
                    raise
                # A concurrent conditional write of this key is in flight: its outcome decides ours.
                time.sleep(min(1.0, 0.05 * 2**attempt))
        raise TimeoutError(f"{self.location}/{key}: still conflicting after {CONFLICT_RETRIES} conditional writes")

    def write(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=data)

    def read(self, key: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.root.bucket, Key=self.root.key(key))["Body"].read()
        except ClientError as error:
            if _status(error) == 404:
                return None
            raise

    def upload(self, key: str, path: Path) -> None:
        # One PUT per file (S3 takes up to 5 GB so): a retried PUT is idempotent, where a retried
        # CompleteMultipartUpload after a lost answer can fail with NoSuchUpload.
        with open(path, "rb") as body:
            self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=body)

    def download(self, key: str, path: Path) -> None:
        body = self.client.get_object(Bucket=self.root.bucket, Key=self.root.key(key))["Body"]
        with atomic_write(path, "wb") as target:
            while chunk := body.read(_CHUNK):
                target.write(chunk)

    def list_keys(self, prefix: str) -> list[str]:
        keys = []
        start = self.root.key(prefix) + "/"
        skip = len(self.root.prefix) + 1 if self.root.prefix else 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.root.bucket, Prefix=start):
            keys += [item["Key"][skip:] for item in page.get("Contents", [])]
        return sorted(keys)
