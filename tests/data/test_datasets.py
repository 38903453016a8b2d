from collections import Counter

import pytest

from tasks.convert.conversion import convert_to_image_directory
from tasks.data.datasets import export_digits, given_or_default_sources
from tasks.errors import InvalidDatasetError, PipelineInputError


@pytest.mark.slow
def test_digits_export_is_a_stratified_seeded_split(tmp_path):
    train, val = export_digits(tmp_path / "digits")
    train_counts = Counter(p.parent.name for p in train.rglob("*.png"))
    val_counts = Counter(p.parent.name for p in val.rglob("*.png"))
    assert sum(train_counts.values()) + sum(val_counts.values()) == 1797
    assert sorted(train_counts) == sorted(val_counts) == [str(d) for d in range(10)]
    for digit in train_counts:
        share = val_counts[digit] / (train_counts[digit] + val_counts[digit])
        assert abs(share - 0.2) < 0.02

    names = sorted(p.name for p in val.rglob("*.png"))
    again = export_digits(tmp_path / "again")[1]
    assert sorted(p.name for p in again.rglob("*.png")) == names
    other_seed = export_digits(tmp_path / "other", seed=2)[1]
    assert sorted(p.name for p in other_seed.rglob("*.png")) != names

    image_dir = convert_to_image_directory(train, tmp_path / "converted")
    assert image_dir.records()[0].width == 8 and image_dir.records()[0].mode == "L"


@pytest.mark.slow
def test_export_is_reused_and_never_overwrites_other_folders(tmp_path):
    train, _ = export_digits(tmp_path / "digits")
    marker = train / "0" / "kept.txt"
    marker.write_text("reuse, do not rebuild")
    export_digits(tmp_path / "digits")
    assert marker.exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "photo.jpg").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        export_digits(tmp_path / "mine")


def test_sources_need_validation_data_or_a_fraction(tmp_path):
    with pytest.raises(InvalidDatasetError, match="give validation_data, or validation_fraction"):
        given_or_default_sources("/data/train", None, tmp_path)
    with pytest.raises(InvalidDatasetError, match="without train_data"):
        given_or_default_sources(None, "/data/validation", tmp_path)
    with pytest.raises(InvalidDatasetError, match="not both"):
        given_or_default_sources("/a", "/b", tmp_path, validation_fraction=0.2)
    with pytest.raises(PipelineInputError, match="validation_fraction 1.2 is not allowed"):
        given_or_default_sources("/a", None, tmp_path, validation_fraction=1.2)
    assert given_or_default_sources("/a", "/b", tmp_path) == ("/a", "/b")
    assert given_or_default_sources("/a", None, tmp_path, validation_fraction=0.2) == ("/a", None)
