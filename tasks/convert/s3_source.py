"""An ``s3://bucket/prefix`` of images, or naming one archive object, as a ``Source``: listed page by page,
downloaded a window of objects at a time to a temporary folder."""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tasks.contracts.image_directory import QuarantinedFile
from tasks.convert.archives import refuse_oversize
from tasks.convert.listing import is_left_by_the_os
from tasks.convert.sources import OpenedSource, Source, content_digest, scratch_space, unpacked
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import in_order
from tasks.storage.s3 import S3Location, download_s3_object, parse_s3_uri, s3_client

_DOWNLOAD_THREADS = 8


@dataclass(frozen=True, slots=True)
class S3Object:
    """One object to download (slotted, its local path a slice of its key: a prefix may hold a million)."""

    key: str
    cut: int  # where in the key its path below the local folder starts
    size: int
    etag: str

    @property
    def relative(self) -> str:
        """Where it goes below the local folder."""
        return self.key[self.cut :]


@dataclass
class S3Survey:
    """What one pass over an S3 listing found. Nothing is kept per key but what is skipped: the objects are listed
    again, page by page, to be downloaded."""

    count: int = 0  # objects to download
    size: int = 0  # their bytes
    digest: str = ""  # of every key listed, with its ETag and size
    folders: dict[str, str] = field(default_factory=dict)  # folder below the prefix -> a key below it
    skipped: list[QuarantinedFile] = field(default_factory=list)  # keys that cannot become files, and why
    single: S3Object | None = None  # the prefix names one object (an archive)


def _s3_key_problem(relative: str) -> str | None:
    """Why an object key (relative to the prefix) cannot be a file below the local folder, if it cannot."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        return (
            "its key is not a plain relative path (it has '..', '.', '//' or '\\' in it): "
            "it could land outside the folder"
        )
    return None


def _listed_line(obj: S3Object) -> str:
    return f"{obj.relative}\0{obj.etag}\0{obj.size}"


class S3Source(Source):
    """Objects below ``s3://bucket/prefix`` (downloaded to a temporary folder), or one archive object.

    The prefix is listed twice, page by page: once to count, size and hash it (the fingerprint), once to download
    it a window of objects at a time; a prefix that changed in between is refused. Keys that cannot be files
    below one folder are skipped and reported instead of failing half way through."""

    def __init__(self, uri: str, max_bytes: int) -> None:
        self.where: S3Location = parse_s3_uri(uri)
        self.location, self.max_bytes = uri, max_bytes
        self._survey: S3Survey | None = None

    def _single(self) -> S3Object | None:
        """The object the prefix names, if it names one."""
        from botocore.exceptions import ClientError

        if not self.where.prefix:
            return None
        try:
            head = s3_client().head_object(Bucket=self.where.bucket, Key=self.where.prefix)
        except ClientError as error:
            if error.response["Error"]["Code"] not in ("404", "NoSuchKey"):
                raise
            return None
        name = self.where.prefix.rsplit("/", 1)[-1]
        return S3Object(self.where.prefix, len(self.where.prefix) - len(name), head["ContentLength"], head["ETag"])

    def _listed(self) -> Iterator[S3Object]:
        """Every object below the prefix, in key order, a page at a time."""
        from botocore.exceptions import ClientError

        prefix = f"{self.where.prefix}/" if self.where.prefix else ""
        try:
            for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=self.where.bucket, Prefix=prefix):
                for o in page.get("Contents", []):
                    if not o["Key"].endswith("/"):  # "folder/" markers of the S3 console
                        yield S3Object(o["Key"], len(prefix), o["Size"], o["ETag"])
        except ClientError as error:
            if error.response["Error"]["Code"] == "NoSuchBucket":
                raise InvalidDatasetError(
                    f"source {self.location}: bucket {self.where.bucket!r} does not exist"
                ) from error
            raise

    @staticmethod
    def _readable(obj: S3Object) -> bool:
        # Hidden keys come down too: the folder rules then apply (a hidden folder of images beside the class
        # folders is a class, ".net"; other hidden entries are skipped and reported).
        return _s3_key_problem(obj.relative) is None and not is_left_by_the_os(PurePosixPath(obj.relative).name)

    @property
    def survey(self) -> S3Survey:
        """The first pass, made once; a source holding nothing readable is refused."""
        if self._survey is None:
            if (single := self._single()) is not None:
                self._survey = S3Survey(1, single.size, content_digest([_listed_line(single)]), single=single)
                return self._survey
            survey, digest = S3Survey(), hashlib.sha256()
            for obj in self._listed():
                digest.update(_listed_line(obj).encode() + b"\n")
                relative = obj.relative
                if problem := _s3_key_problem(relative):
                    survey.skipped.append(QuarantinedFile(path=relative, reason=problem))
                elif self._readable(obj):
                    survey.count, survey.size = survey.count + 1, survey.size + obj.size
                    parts = relative.split("/")
                    for depth in range(1, len(parts)):
                        survey.folders["/".join(parts[:depth])] = relative
            survey.digest = digest.hexdigest()
            if not survey.count:
                skipped = "; ".join(f"{q.path!r}: {q.reason}" for q in survey.skipped)
                read = f" it can read (skipped {skipped})" if skipped else ""
                raise InvalidDatasetError(f"source {self.location} holds no objects{read}")
            self._survey = survey
        return self._survey

    def fingerprint(self) -> str:
        return self.survey.digest

    def _download(self, destination: Path) -> list[QuarantinedFile]:
        """Stream each object to a file below ``destination`` (chunked, each read again if its body is cut off), a
        window of them at a time; the keys skipped because they are also a folder (S3 allows "cat" beside
        "cat/0.png", a file system does not)."""
        client, survey, digest, also_folders = s3_client(), self.survey, hashlib.sha256(), []

        def fetch(obj: S3Object) -> None:
            download_s3_object(client, self.where.bucket, obj.key, destination / obj.relative)

        def to_fetch() -> Iterator[tuple[S3Object]]:
            for obj in [survey.single] if survey.single else self._listed():
                digest.update(_listed_line(obj).encode() + b"\n")
                if not self._readable(obj) and not survey.single:
                    continue
                if (folder_of := survey.folders.get(obj.relative)) is not None:
                    also_folders.append(
                        QuarantinedFile(
                            path=obj.relative,
                            reason=f"the object's key is also the folder of {folder_of!r}: a file cannot be a folder too",
                        )
                    )
                    continue
                yield (obj,)

        with scratch_space(f"to download {self.location}", destination, survey.size):
            destination.mkdir(parents=True, exist_ok=True)
            with ThreadPoolExecutor(max_workers=_DOWNLOAD_THREADS) as pool:
                for _ in in_order(pool, fetch, to_fetch()):
                    pass
        if digest.hexdigest() != survey.digest:
            raise InvalidDatasetError(
                f"source {self.location} changed while it was read (objects added, removed or rewritten between "
                "listing it and downloading it): convert it again once it holds what it should"
            )
        return also_folders

    @contextlib.contextmanager
    def open(self) -> Iterator[OpenedSource]:
        survey = self.survey
        refuse_oversize(self.location, survey.size, self.max_bytes)
        with tempfile.TemporaryDirectory(prefix="convert-") as scratch:
            scratch = Path(scratch)
            if survey.single is None:
                also_folders = self._download(scratch / "files")
                yield OpenedSource(scratch / "files", survey.skipped + also_folders)
                return
            self._download(scratch / "download")
            with unpacked(scratch / "download" / survey.single.relative, scratch, self.max_bytes) as opened:
                yield opened
