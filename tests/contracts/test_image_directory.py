import hashlib
import json

import pytest

from tasks.contracts.image_directory import MANIFEST_NAME, ImageDirectory, ImageDirectoryManifest, ImageRecord
from tasks.contracts.image_index import INDEX_NAME
from tasks.errors import InvalidDatasetError


def format_1(tmp_path, records: list[ImageRecord]) -> dict:
    manifest = {
        "format_version": 1,
        "labeled": True,
        "classes": ["cat", "dog"],
        "counts": {"cat": 2, "dog": 1},
        "images": [r.model_dump() for r in records],
        "source": "/data/pets",
    }
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    return manifest


def test_a_format_1_directory_opens_with_the_content_hash_it_always_had(tmp_path):
    records = [
        ImageRecord(path=p, label=label, sha256=h * 32, size_bytes=9, width=4, height=3, mode="RGB", source_path=s)
        for p, label, h, s in [("dog/b.png", "dog", "bb", None), ("cat/a.png", "cat", "aa", "x/a.png"), ("cat/c.png", "cat", "cc", "c")]
    ]  # fmt: skip
    (tmp_path / "old").mkdir()
    format_1(tmp_path / "old", records)
    old = ImageDirectory(tmp_path / "old")
    # Format 1's content hash: each record's path, label and sha256, in path order.
    digest = hashlib.sha256()
    for r in sorted(records, key=lambda r: r.path):
        digest.update(f"{r.path}\0{r.label}\0{r.sha256}\n".encode())
    assert old.content_hash == digest.hexdigest() and len(old) == 3
    assert old.records() == records
    assert [(p.name, label) for p, label in old.samples()] == [("b.png", 1), ("a.png", 0), ("c.png", 0)]

    (tmp_path / "new").mkdir()
    ImageDirectory.write(
        tmp_path / "new", ImageDirectoryManifest(**{**old.manifest.model_dump(), "format_version": 2}), records
    )
    new = ImageDirectory(tmp_path / "new")
    assert new.content_hash == old.content_hash and new.records() == records
    assert json.loads((tmp_path / "new" / MANIFEST_NAME).read_text())["image_count"] == 3


def test_a_manifest_of_an_unknown_format_or_without_its_index_asks_for_a_new_conversion(tmp_path):
    records = [ImageRecord(path="cat/a.png", label="cat", sha256="aa" * 32, size_bytes=1, width=1, height=1, mode="L")]
    manifest = ImageDirectoryManifest(labeled=True, classes=["cat"], counts={"cat": 1}, source="/x")
    ImageDirectory.write(tmp_path, manifest, records)
    data = json.loads((tmp_path / MANIFEST_NAME).read_text())
    (tmp_path / MANIFEST_NAME).write_text(json.dumps({**data, "format_version": 3}))
    with pytest.raises(InvalidDatasetError, match="format 3; this version reads formats 1 and 2: convert the images"):
        ImageDirectory(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    (tmp_path / INDEX_NAME).write_bytes(b"PK")
    with pytest.raises(InvalidDatasetError, match="its index .* cannot be read .*: convert the images again"):
        ImageDirectory(tmp_path).samples()


def test_image_directory_without_manifest_is_refused(tmp_path):
    with pytest.raises(InvalidDatasetError, match=MANIFEST_NAME):
        ImageDirectory(tmp_path)
