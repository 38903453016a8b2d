"""The checks made before any work: in seconds, with the message the stage itself would give later."""

import pytest

from tasks.data.preflight import check_source, check_training_inputs, check_training_sources, folder_classes
from tasks.errors import InvalidDatasetError, InvalidTrainingSetupError, PretrainedWeightsError
from tests.helpers import write_class_folders


def test_a_missing_local_source_is_refused_naming_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidDatasetError) as refused:
        check_source("photos", "scoring")
    assert str(refused.value) == (
        f"the scoring data 'photos' does not exist (looked for {tmp_path / 'photos'}): give a class-per-folder "
        "folder, a .zip/.tar archive or an s3://bucket/prefix"
    )


def test_remote_sources_are_left_to_their_stage():
    check_source("s3://bucket/photos", "training")
    check_source("https://example.com/photos.zip", "training")
    assert folder_classes("s3://bucket/photos") is None


def test_a_folders_classes_are_its_class_folders_and_a_flat_folder_has_none(tmp_path):
    assert folder_classes(str(write_class_folders(tmp_path / "train", 1))) == {"red", "green", "blue"}
    assert folder_classes(str(tmp_path / "train" / "red")) is None  # images only: unlabeled, its stage decides
    assert folder_classes(str(tmp_path / "nope")) is None


def test_train_and_validation_folders_with_different_classes_are_refused_before_any_conversion(tmp_path):
    train = write_class_folders(tmp_path / "train", 1, classes=("red", "green"))
    validation = write_class_folders(tmp_path / "val", 1, classes=("red", "blue"))
    with pytest.raises(InvalidDatasetError, match=r"only in training \['green'\], only in validation \['blue'\]"):
        check_training_sources(str(train), str(validation), None)
    check_training_sources(str(train), str(train), None)
    check_training_sources(None, None, None)  # the bundled digits


def test_the_network_and_its_weights_are_checked_with_the_data(tmp_path):
    train = str(write_class_folders(tmp_path / "train", 1))
    with pytest.raises(InvalidTrainingSetupError, match="image_size is 100 but vit_b_16"):
        check_training_inputs(train, train, None, "vit_b_16", 100)
    with pytest.raises(PretrainedWeightsError, match="weights_path nope.pth for resnet18 does not exist"):
        check_training_inputs(train, train, None, "resnet18", None, "nope.pth")
    check_training_inputs(train, train, None, "resnet18", None, "https://example.com/resnet18.pth")
