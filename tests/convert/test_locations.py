"""A conversion's source location as its type: folder, archive, S3 prefix; anything else refused in one line."""

import os
import zipfile

import pytest

from tasks.convert.locations import open_source
from tasks.convert.s3_source import S3Source
from tasks.convert.sources import ArchiveSource, FolderSource
from tasks.errors import InvalidDatasetError


def test_a_folder_an_archive_and_an_s3_prefix_each_open_as_their_source(tmp_path):
    (tmp_path / "photos").mkdir()
    with zipfile.ZipFile(tmp_path / "photos.zip", "w") as archive:
        archive.writestr("cat/1.png", b"")
    assert isinstance(open_source(str(tmp_path / "photos")), FolderSource)
    assert isinstance(open_source(str(tmp_path / "photos.zip")), ArchiveSource)
    assert isinstance(open_source("s3://bucket/photos"), S3Source)


def test_a_missing_source_is_refused(tmp_path):
    with pytest.raises(InvalidDatasetError, match=f"^source {tmp_path / 'nope'} does not exist$"):
        open_source(str(tmp_path / "nope"))


def test_a_source_that_is_neither_a_folder_nor_a_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InvalidDatasetError, match="is neither a folder nor a regular file"):
        open_source(str(tmp_path / "pipe"))
