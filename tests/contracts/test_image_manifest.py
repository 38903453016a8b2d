"""tasks/contracts/image_manifest.py: image_directory.json's schema. Written and read with a directory:
test_image_directory.py."""

import pytest
from pydantic import ValidationError

from tasks.contracts.image_manifest import (
    FORMAT_VERSION,
    ImageDirectoryManifest,
    ImageRecord,
    SplitRecord,
)


def test_a_manifest_of_the_current_format_needs_only_what_convert_knows_at_its_start():
    manifest = ImageDirectoryManifest(labeled=False, classes=[], counts={}, source="s3://bucket/photos")
    assert manifest.format_version == FORMAT_VERSION == 2
    assert (manifest.image_count, manifest.content_hash, manifest.split, manifest.normalisation) == (0, "", None, None)
    split = SplitRecord(source="/d", source_content_hash="ab", fraction=0.8, seed=1, side="first")
    again = ImageDirectoryManifest.model_validate_json(manifest.model_copy(update={"split": split}).model_dump_json())
    assert again.split == split and again.split.near_duplicate_distance is None


def test_a_record_refuses_an_orientation_or_a_hash_out_of_range():
    record = dict(path="a.png", label=None, sha256="aa" * 32, size_bytes=1, width=1, height=1, mode="L")
    assert ImageRecord(**record).orientation == 1 and ImageRecord(**record).perceptual_hash == 0
    for bad in ({"orientation": 9}, {"perceptual_hash": 1 << 64}, {"perceptual_hash": -1}):
        with pytest.raises(ValidationError):
            ImageRecord(**record, **bad)
