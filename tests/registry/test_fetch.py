"""Fetching a registered version from S3: the cached copy is checked against the registered sha256 and
downloaded again when it was changed; fetch_to makes a checked copy in a new folder and refuses a used one."""

import logging

import pytest

from tasks.errors import InvalidModelDirectoryError
from tasks.registry.fetch import fetch_model, fetch_to
from tests.helpers import NAME, register_test_model

pytestmark = pytest.mark.integration


def test_a_changed_cached_copy_is_downloaded_again_and_fetch_to_wants_a_new_folder(
    s3_bucket, trained_model, tmp_path, caplog
):
    registry = f"s3://{s3_bucket}/registry"
    registration, _ = register_test_model(registry, trained_model)
    cache = tmp_path / "cache"
    first = fetch_model(registry, f"{NAME}/1", cache)
    assert (first.root / "classes.json").read_text() == (trained_model / "classes.json").read_text()

    (first.root / "classes.json").write_text('["tampered"]')
    with caplog.at_level(logging.WARNING, logger="tasks.registry.fetch"):
        again = fetch_model(registry, f"{NAME}/1", cache)
    assert again.root == first.root
    assert (again.root / "classes.json").read_text() == (trained_model / "classes.json").read_text()
    assert any(
        "classes.json: sha256" in r.getMessage() and "downloading it again" in r.getMessage() for r in caplog.records
    )

    copy = fetch_to(registry, f"{NAME}/1", tmp_path / "copy")
    assert copy.version == 1 and sorted(p.name for p in (tmp_path / "copy").iterdir()) == sorted(
        [*registration.files, "registration.json"]
    )
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("kept")
    with pytest.raises(InvalidModelDirectoryError, match="already exists and is not an empty folder"):
        fetch_to(registry, f"{NAME}/1", tmp_path / "used")
    assert (tmp_path / "used" / "mine.txt").read_text() == "kept"
