"""Storage locations: plain paths and ``s3://bucket/prefix`` URIs, and the one way this project makes S3 clients.

S3 goes through boto3 with an explicit retry configuration (standard mode: 5xx, throttling and connection
errors are retried with backoff). ``AWS_ENDPOINT_URL`` selects a non-AWS endpoint (MinIO, Ceph, moto);
credentials come from boto3's usual chain (environment, ~/.aws, instance roles).

botocore's retries end once a response's headers have arrived: a connection dropped in the middle of a
GET body surfaces as an exception from ``read()`` (or as fewer bytes than ``ContentLength``). Every S3
read in this project goes through ``read_s3_bytes`` / ``download_s3_object``, which ask again for the
whole object when that happens.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from tasks.errors import InvalidDatasetError, InvalidStorageURIError, OutputStorageError
from tasks.storage.local_files import atomic_write

S3_SCHEME = "s3://"
RETRY_ATTEMPTS = 10
BODY_ATTEMPTS = 5
_CHUNK = 1 << 20
logger = logging.getLogger(__name__)


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


def is_remote(location: str) -> bool:
    """An S3 URI or any other scheme://: read by its stage, not checked on this host's disk."""
    return is_s3_uri(location) or "://" in location


def existing_local_path(location: str, what: str, give: str) -> Path | None:
    """``location`` on this host's disk, refused in one line when it does not exist (``what``: "the training data",
    ``give``: what to give instead); None for a remote one."""
    if is_remote(location):
        return None
    path = Path(location).expanduser()
    if not path.exists():
        raise InvalidDatasetError(f"{what} {location!r} does not exist (looked for {path.resolve()}): {give}")
    return path


def parse_s3_uri(uri: str) -> S3Location:
    """``s3://bucket/some/prefix/`` -> S3Location("bucket", "some/prefix")."""
    if not is_s3_uri(uri):
        raise InvalidStorageURIError(f"{uri!r} is not an S3 URI: expected s3://bucket/prefix")
    bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise InvalidStorageURIError(f"{uri!r} names no bucket: expected s3://bucket/prefix")
    if any(part in (".", "..") for part in prefix.split("/")):
        # Keys are mirrored into local folders (tasks/storage/work_dir_on_s3.py): a ".." would climb out of them.
        raise InvalidStorageURIError(f"{uri!r} has a '.' or '..' part: expected s3://bucket/prefix")
    return S3Location(bucket=bucket, prefix=prefix.strip("/"))


def read_bytes(location: str | os.PathLike[str]) -> bytes:
    """A small file's bytes from a local path or an ``s3://bucket/key``."""
    if is_s3_uri(location):
        where = parse_s3_uri(str(location))
        return read_s3_bytes(s3_client(), where.bucket, where.prefix)
    with open(location, "rb") as handle:
        return handle.read()


def s3_client(max_attempts: int = RETRY_ATTEMPTS):
    """A boto3 S3 client with standard-mode retries; honours ``AWS_ENDPOINT_URL``."""
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": max_attempts}, connect_timeout=10, read_timeout=60)
    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None, config=config)


class IncompleteBodyError(ConnectionError):
    """An S3 object's body ended before its ``ContentLength``; transient, so retried like a dropped connection."""


def _body_errors() -> tuple[type[BaseException], ...]:
    import urllib3.exceptions
    from botocore.exceptions import HTTPClientError, IncompleteReadError

    # HTTPClientError covers botocore's ResponseStreamingError, ReadTimeoutError and ConnectionClosedError;
    # ConnectionError covers a reset socket and IncompleteBodyError.
    return (
        HTTPClientError,
        IncompleteReadError,
        urllib3.exceptions.HTTPError,
        http.client.HTTPException,
        ConnectionError,
        TimeoutError,
    )


def _get_body(
    client: Any, bucket: str, key: str, open_sink: Callable[[], contextlib.AbstractContextManager[IO[bytes]]]
) -> None:
    """GET ``key`` into a fresh sink per attempt; a sink is kept only when the whole body arrived."""
    errors = _body_errors()
    for attempt in range(1, BODY_ATTEMPTS + 1):
        response = client.get_object(Bucket=bucket, Key=key)
        body, expected = response["Body"], response["ContentLength"]
        try:
            with open_sink() as sink:
                received = 0
                while chunk := body.read(_CHUNK):
                    sink.write(chunk)
                    received += len(chunk)
                if received != expected:
                    raise IncompleteBodyError(f"{received:,} of {expected:,} bytes arrived")
            return
        except errors as error:
            body.close()
            if attempt == BODY_ATTEMPTS:
                raise IncompleteBodyError(
                    f"s3://{bucket}/{key}: the body was cut off {BODY_ATTEMPTS} times in a row, last: {error}"
                ) from error
            logger.warning(
                "s3://%s/%s: body cut off (%s); reading it again (attempt %d of %d)",
                bucket,
                key,
                error,
                attempt + 1,
                BODY_ATTEMPTS,
            )
            time.sleep(min(2.0, 0.1 * 2**attempt))


def read_s3_bytes(client: Any, bucket: str, key: str) -> bytes:
    """An object's whole body, read again when the connection drops mid-way."""
    parts: list[bytes] = []

    @contextlib.contextmanager
    def sink() -> Iterator[IO[bytes]]:
        buffer = io.BytesIO()
        yield buffer
        parts.append(buffer.getvalue())

    _get_body(client, bucket, key, sink)
    return parts[-1]


def download_s3_object(client: Any, bucket: str, key: str, path: str | os.PathLike[str]) -> None:
    """Stream an object to ``path`` (atomically, in chunks), read again when the connection drops mid-way."""
    _get_body(client, bucket, key, lambda: atomic_write(Path(path), "wb"))


def no_such_key(error: BaseException) -> bool:
    """Whether ``error`` is S3 saying the object does not exist."""
    from botocore.exceptions import ClientError

    return isinstance(error, ClientError) and error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404")


def read_s3_object(uri: str) -> bytes | None:
    """An object's bytes, or None when there is no such key."""
    from botocore.exceptions import ClientError

    where = parse_s3_uri(uri)
    try:
        return read_s3_bytes(s3_client(), where.bucket, where.prefix)
    except ClientError as error:
        if no_such_key(error):
            return None
        raise


# S3 error codes a retry cannot mend: the bucket or the credentials refuse the write.
S3_REFUSALS = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "InvalidBucketName",
        "NoSuchBucket",
        "SignatureDoesNotMatch",
        "EntityTooLarge",
    }
)


@contextlib.contextmanager
def s3_writing(what: str) -> Iterator[None]:
    """Around a PUT of ``what`` (``s3://bucket/key``): S3 refusing it for good (no such bucket, access denied, …)
    raises ``OutputStorageError`` naming the object. Other failures, left after boto's own retries (a 5xx, a
    dropped connection), propagate as they are, for the stage's retries."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as error:
        details = error.response.get("Error", {})
        if details.get("Code") not in S3_REFUSALS:
            raise
        raise OutputStorageError(
            f"S3 refused to store {what}: {details.get('Code')} ({details.get('Message', 'no message')}); check the "
            "bucket's name and that these credentials may write there (nothing was retried: it would fail the same)"
        ) from None


def upload_files(root: Path, names: Iterable[str], uri: str, *, last: tuple[str, bytes] | None = None) -> None:
    """Upload ``root/<name>`` to ``<uri>/<name>`` for each name, in order (so a reader that sees the last one
    can rely on the others being there); then ``last``'s bytes, read before any of them, as ``<uri>/<its name>``."""
    where, client = parse_s3_uri(uri), s3_client()
    for name in names:
        with open(root / name, "rb") as body, s3_writing(f"s3://{where.bucket}/{where.key(name)}"):
            client.put_object(Bucket=where.bucket, Key=where.key(name), Body=body)
    if last:
        name, data = last
        with s3_writing(f"s3://{where.bucket}/{where.key(name)}"):
            client.put_object(Bucket=where.bucket, Key=where.key(name), Body=data)


def list_s3_names(uri: str) -> list[str]:
    """The names (keys relative to ``uri``) of every object below it."""
    where, client = parse_s3_uri(uri), s3_client()
    start = where.key() + "/" if where.prefix else ""
    names = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=where.bucket, Prefix=start):
        names += [item["Key"][len(start) :] for item in page.get("Contents", [])]
    return sorted(names)


def download_files(uri: str, names: Iterable[str], root: Path) -> None:
    """Download ``<uri>/<name>`` to ``root/<name>`` for each name, in order, each file atomically."""
    where, client = parse_s3_uri(uri), s3_client()
    for name in names:
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
            raise InvalidStorageURIError(f"{uri}/{name}: a name that would land outside {root}")
        download_s3_object(client, where.bucket, where.key(name), root / name)
