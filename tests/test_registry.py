import json

import pytest

from tasks import InvalidModelNameError, ModelDirectory
from tasks.registry import (
    REGISTRATION_FILE,
    DatasetLineage,
    default_model_name,
    list_versions,
    read_registration,
    register_model,
)
from tasks.fileio import sha256_file

LINEAGE = {"train": DatasetLineage(source="/data/train", content_hash="ab" * 32, images=24)}


def register(registry, model, name="colours-resnet18"):
    return register_model(
        registry, name, ModelDirectory(model), metrics={"accuracy": 0.9}, params={"epochs": 2}, datasets=LINEAGE,
        flow_run_id="run-1", tags={"team": "vision"},
    )  # fmt: skip


def test_versions_count_up_and_carry_lineage(tmp_path, trained_model):
    versions = [register(tmp_path, trained_model)[0].version for _ in range(3)]
    assert versions == [1, 2, 3] and list_versions(tmp_path, "colours-resnet18") == [1, 2, 3]

    record = read_registration(tmp_path, "colours-resnet18", 2)
    assert record.metrics == {"accuracy": 0.9} and record.params == {"epochs": 2}
    assert record.datasets["train"].content_hash == "ab" * 32 and record.flow_run_id == "run-1"
    folder = tmp_path / "colours-resnet18" / "2"
    for name, digest in record.files.items():
        assert sha256_file(folder / name) == digest == sha256_file(trained_model / name)
    assert ModelDirectory(folder).classes == ["blue", "green", "red"], "a version is a usable ModelDirectory"


def test_interrupted_registration_is_not_listed_and_its_number_not_reused(tmp_path, trained_model):
    register(tmp_path, trained_model)
    (tmp_path / "colours-resnet18" / "2").mkdir()  # a registration that died before committing
    registration, folder = register(tmp_path, trained_model)
    assert registration.version == 3 and list_versions(tmp_path, "colours-resnet18") == [1, 3]
    assert json.loads((folder / REGISTRATION_FILE).read_text())["version"] == 3


def test_bad_model_names_are_refused(tmp_path, trained_model):
    for bad in ("", "Digits", "../escape", "a/b", "x" * 101):
        with pytest.raises(InvalidModelNameError):
            register(tmp_path, trained_model, name=bad)
    assert list(tmp_path.iterdir()) == []


def test_default_model_name_comes_from_the_data_set():
    assert default_model_name("/data/digits/train", "resnet18") == "digits-resnet18"
    assert default_model_name("/data/My Pets.zip", "densenet121") == "my-pets-densenet121"
