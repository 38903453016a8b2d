import json

import pytest

from tasks.contracts.model_directory import ModelDirectory, ModelSpec, read_model_spec
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.validate import check_training_data
from tasks.errors import InvalidDatasetError, InvalidModelDirectoryError, NotLabeledDatasetError
from tasks.model.untrained import write_untrained_model_directory
from tests.helpers import sample_photos, write_burst, write_class_folders, write_crops, write_image


def convert(source, out):
    return convert_to_image_directory(source, out)


def test_matching_labeled_sets_pass_with_a_report(tmp_path):
    train = convert(write_class_folders(tmp_path / "t", 4), tmp_path / "train")
    val = convert(write_class_folders(tmp_path / "v", 2, seed=1), tmp_path / "val")
    report = check_training_data(train, val)
    assert report.classes == ["blue", "green", "red"]
    assert report.train_counts == {"blue": 4, "green": 4, "red": 4} and report.imbalance_ratio == 1.0


def test_unlabeled_training_data_raises_not_labeled(tmp_path):
    for i in range(3):
        write_image(tmp_path / "flat" / f"{i}.png", (0, 0, 0), seed=i)
    train = convert(tmp_path / "flat", tmp_path / "train")
    val = convert(write_class_folders(tmp_path / "v", 2), tmp_path / "val")
    with pytest.raises(NotLabeledDatasetError, match="training data .* is not labeled"):
        check_training_data(train, val)


def test_different_class_sets_name_the_differences(tmp_path):
    train = convert(write_class_folders(tmp_path / "t", 2, classes=("red", "green")), tmp_path / "train")
    val = convert(write_class_folders(tmp_path / "v", 2, classes=("red", "blue")), tmp_path / "val")
    with pytest.raises(InvalidDatasetError) as error:
        check_training_data(train, val)
    assert "only in training ['green']" in str(error.value)
    assert "only in validation ['blue']" in str(error.value)


def test_a_single_class_cannot_train_a_classifier(tmp_path):
    train = convert(write_class_folders(tmp_path / "t", 3, classes=("red",)), tmp_path / "train")
    val = convert(write_class_folders(tmp_path / "v", 3, classes=("red",)), tmp_path / "val")
    with pytest.raises(InvalidDatasetError, match="at least two"):
        check_training_data(train, val)


def test_model_directory_without_spec_is_invalid(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"\0" * 8)
    with pytest.raises(InvalidModelDirectoryError, match="model_spec.json is missing"):
        read_model_spec(tmp_path / "model")
    with pytest.raises(InvalidModelDirectoryError, match="does not exist"):
        read_model_spec(tmp_path / "missing")


def test_model_spec_with_unknown_architecture_is_invalid(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model_spec.json").write_text(json.dumps({"architecture": "lenet5"}))
    with pytest.raises(InvalidModelDirectoryError, match="architecture"):
        read_model_spec(tmp_path / "model")


def test_pretrained_spec_whose_weights_file_is_missing_is_invalid(tmp_path):
    spec = ModelSpec(architecture="densenet121", pretrained=True, weights_path=str(tmp_path / "densenet121.pth"))
    with pytest.raises(InvalidModelDirectoryError, match="densenet121.pth for densenet121 does not exist"):
        write_untrained_model_directory(tmp_path / "model", spec)


def test_untrained_directory_is_not_a_trained_model(resnet_spec):
    with pytest.raises(InvalidModelDirectoryError, match="trained model directory"):
        ModelDirectory(resnet_spec)


def test_family_options_are_checked():
    with pytest.raises(ValueError, match="memory_efficient applies to the DenseNet family"):
        ModelSpec(architecture="resnet18", memory_efficient=True)
    assert ModelSpec(architecture="wide_resnet50_2", zero_init_residual=True).zero_init_residual


def test_a_training_class_below_the_minimum_is_refused_with_its_count(tmp_path):
    write_class_folders(tmp_path / "t", 3, classes=("red", "blue"))
    write_image(tmp_path / "t" / "green" / "only.png", (30, 200, 40))
    train = convert(tmp_path / "t", tmp_path / "train")
    val = convert(write_class_folders(tmp_path / "v", 2, seed=1), tmp_path / "val")
    with pytest.raises(InvalidDatasetError, match=r"fewer than 2 images \(min_images_per_class\): 'green' has 1"):
        check_training_data(train, val)
    with pytest.raises(InvalidDatasetError, match="fewer than 4 images .*'blue' has 3, 'green' has 1, 'red' has 3"):
        check_training_data(train, val, min_images_per_class=4)
    assert check_training_data(train, val, min_images_per_class=1).train_counts["green"] == 1


def test_leakage_and_imbalance_are_reported(tmp_path):
    write_class_folders(tmp_path / "t", 2, classes=("red",))
    write_class_folders(tmp_path / "t", 6, classes=("blue",))
    write_class_folders(tmp_path / "v", 2, classes=("red", "blue"), seed=1)
    for name in ("red_0.png", "red_1.png"):
        (tmp_path / "v" / "red" / f"copy_{name}").write_bytes((tmp_path / "t" / "red" / name).read_bytes())
    report = check_training_data(convert(tmp_path / "t", tmp_path / "train"), convert(tmp_path / "v", tmp_path / "val"))
    assert report.imbalance_ratio == 3.0 and report.model_dump()["imbalance_ratio"] == 3.0
    assert report.leaked == 2 and report.leaked_counts == {"red": 2}
    assert sorted(report.leaked_examples) == [
        ("red/red_0.png", "red/copy_red_0.png"),
        ("red/red_1.png", "red/copy_red_1.png"),
    ]


def test_label_validation_artifact_reports_leakage(prefect_server, tmp_path):
    import asyncio

    from prefect import flow

    from tasks.data.prefect_tasks import validate_labels
    from tests.helpers import artifacts_and_run_count

    write_class_folders(tmp_path / "t", 3)
    write_class_folders(tmp_path / "v", 2, seed=1)
    (tmp_path / "v" / "red" / "copy.png").write_bytes((tmp_path / "t" / "red" / "red_0.png").read_bytes())
    train, val = convert(tmp_path / "t", tmp_path / "train").root, convert(tmp_path / "v", tmp_path / "val").root

    @flow
    def run():
        state = validate_labels(str(train), str(val), return_state=True)
        return state.state_details.flow_run_id, state.state_details.task_run_id

    artifacts, _ = asyncio.run(artifacts_and_run_count(*run()))
    rows = {row["class"]: row for row in json.loads(artifacts["label-validation"])}
    assert rows["red"] == {
        "class": "red",
        "train": 3,
        "validation": 3,
        "in both sets": 1,
        "near-duplicates in both sets": 0,  # 16-pixel images: too small for a perceptual hash
    }
    assert rows["blue"]["in both sets"] == rows["green"]["in both sets"] == 0


def test_a_near_duplicate_across_the_two_folders_is_reported_with_an_example(tmp_path):
    """Real photos: validation holds a half-size copy of a training photo (near-duplicate) and an exact copy of
    another (leaked, reported as such and not twice)."""
    photos = sample_photos()
    write_crops(tmp_path / "t" / "china", "china", photos["china"])
    write_crops(tmp_path / "t" / "flower", "flower", photos["flower"])
    write_burst(tmp_path / "t" / "china", "china", photos["china"])
    for name in ("china_half.png", "china_half_q40.jpg"):  # the burst's copies go to validation
        (tmp_path / "t" / "china" / name).unlink()
    write_burst(tmp_path / "v" / "china", "china", photos["china"])
    (tmp_path / "v" / "china" / "china.jpg").unlink()
    (tmp_path / "v" / "china" / "china_half_q40.jpg").unlink()
    write_crops(tmp_path / "v" / "flower", "flower", photos["flower"])
    for part in ("left", "right", "top"):
        (tmp_path / "v" / "flower" / f"flower_{part}.jpg").unlink()  # flower_bottom.jpg: an exact copy
    train, validation = (convert(tmp_path / side, tmp_path / f"{side}-converted") for side in "tv")

    report = check_training_data(train, validation)

    assert report.leaked_counts == {"flower": 1}
    assert report.near_duplicate_counts == {"china": 1} and report.near_duplicates == 1
    ((train_path, validation_path, bits),) = report.near_duplicate_examples
    assert (train_path, validation_path) == ("china/china.jpg", "china/china_half.png") and bits <= 8
    assert check_training_data(train, validation, near_duplicate_distance=-1).near_duplicate_counts == {}
