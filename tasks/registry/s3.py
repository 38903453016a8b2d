"""The registry on S3 (or any S3 endpoint: ``AWS_ENDPOINT_URL``), through ``tasks.storage.s3.s3_client``.

Exclusive creates are conditional writes, ``put_object(IfNoneMatch="*")``: S3 answers 412 when the key
exists and 409 when another conditional write of the same key is in flight (then we ask again). The
compare-and-swap of an alias is ``put_object(IfMatch=etag)`` (412 when the key changed since it was read).
Transient failures (5xx, throttling, dropped connections) are retried by the client's standard retry mode,
bodies cut off mid-way by ``tasks.storage.s3``'s reads.
"""

from __future__ import annotations

import time
from pathlib import Path

from botocore.exceptions import ClientError

from tasks.registry.backends import RegistryBackend
from tasks.storage.s3 import download_s3_object, parse_s3_uri, read_s3_bytes, s3_client, s3_writing

CONFLICT_RETRIES = 20


def _status(error: ClientError) -> int:
    return error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


class S3Backend(RegistryBackend):
    def __init__(self, uri: str) -> None:
        self.root = parse_s3_uri(uri)
        self.location = str(self.root)
        self.client = s3_client()

    def create_exclusive(self, key: str, data: bytes) -> bool:
        return self._put_conditional(key, data, IfNoneMatch="*")

    def replace_if(self, key: str, data: bytes, tag: str | None) -> bool:
        return self._put_conditional(key, data, **({"IfMatch": tag} if tag else {"IfNoneMatch": "*"}))

    def _put_conditional(self, key: str, data: bytes, **condition: str) -> bool:
        for attempt in range(CONFLICT_RETRIES):
            try:
                # A refusal (no such bucket: also a 404) is an OutputStorageError, not a lost condition.
                with s3_writing(f"s3://{self.root.bucket}/{self.root.key(key)}"):
                    self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=data, **condition)
                return True
            except ClientError as error:
                # 404: IfMatch on a key deleted since it was read.
                if _status(error) in (412, 404):
                    return False
                if _status(error) != 409:
                    raise
                # A concurrent conditional write of this key is in flight: its outcome decides ours.
                time.sleep(min(1.0, 0.05 * 2**attempt))
        raise TimeoutError(f"{self.location}/{key}: still conflicting after {CONFLICT_RETRIES} conditional writes")

    def write(self, key: str, data: bytes) -> None:
        with s3_writing(f"s3://{self.root.bucket}/{self.root.key(key)}"):
            self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=data)

    def read(self, key: str) -> bytes | None:
        try:
            return read_s3_bytes(self.client, self.root.bucket, self.root.key(key))
        except ClientError as error:
            if _status(error) == 404:
                return None
            raise

    def read_tagged(self, key: str) -> tuple[bytes, str] | None:
        # The ETag read first is the one the swap is conditioned on: if the body read after it is of a newer
        # object, the swap fails and the caller reads again, so pairing an old tag with new bytes is harmless.
        try:
            tag = self.client.head_object(Bucket=self.root.bucket, Key=self.root.key(key))["ETag"]
        except ClientError as error:
            if _status(error) == 404:
                return None
            raise
        data = self.read(key)
        return None if data is None else (data, tag)

    def upload(self, key: str, path: Path) -> None:
        # One PUT per file (S3 takes up to 5 GB so): a retried PUT is idempotent, where a retried
        # CompleteMultipartUpload after a lost answer can fail with NoSuchUpload.
        with open(path, "rb") as body, s3_writing(f"s3://{self.root.bucket}/{self.root.key(key)}"):
            self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=body)

    def download(self, key: str, path: Path) -> None:
        download_s3_object(self.client, self.root.bucket, self.root.key(key), path)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.root.bucket, Key=self.root.key(key))

    def list_keys(self, prefix: str) -> list[str]:
        keys = []
        start = self.root.key(prefix)
        start += "/" if start else ""
        skip = len(self.root.prefix) + 1 if self.root.prefix else 0
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.root.bucket, Prefix=start):
            keys += [item["Key"][skip:] for item in page.get("Contents", [])]
        return sorted(keys)
