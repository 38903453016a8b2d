"""The registry contract, run against both backends: a local folder and the real HTTP S3 endpoint."""

import json
import shutil

import pytest

from tasks import InvalidModelNameError, ModelDirectory, PipelineInputError
from tasks.errors import ModelNotFoundError
from tasks.fileio import sha256_file
from tasks.registry import (
    CLAIM_FILE,
    REGISTRATION_FILE,
    DatasetLineage,
    default_model_name,
    fetch_model,
    list_versions,
    load_model,
    open_backend,
    read_aliases,
    read_registration,
    register_model,
    resolve,
    set_alias,
)

LINEAGE = {"train": DatasetLineage(source="/data/train", content_hash="ab" * 32, images=24)}
NAME = "colours-resnet18"


def register(registry, model, name=NAME, accuracy=0.9, **options):
    return register_model(
        registry, name, ModelDirectory(model), metrics={"accuracy": accuracy}, params={"epochs": 2},
        datasets=LINEAGE, flow_run_id="run-1", tags={"team": "vision"}, **options,
    )  # fmt: skip


@pytest.fixture(params=["local", "s3"])
def registry(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "registry")
    return f"s3://{request.getfixturevalue('s3_bucket')}/team/models"


def test_versions_count_up_and_carry_lineage(registry, trained_model, tmp_path):
    versions = [register(registry, trained_model)[0].version for _ in range(3)]
    assert versions == [1, 2, 3] and list_versions(registry, NAME) == [1, 2, 3]

    record = read_registration(registry, NAME, 2)
    assert record.metrics == {"accuracy": 0.9} and record.params == {"epochs": 2} and record.tags == {"team": "vision"}
    assert record.datasets["train"].content_hash == "ab" * 32 and record.flow_run_id == "run-1"
    model = fetch_model(registry, f"{NAME}/2", tmp_path / "cache")
    for name, digest in record.files.items():
        assert sha256_file(model.root / name) == digest == sha256_file(trained_model / name)
    assert model.classes == ["blue", "green", "red"], "a fetched version is a usable ModelDirectory"


def test_references_and_aliases_resolve_and_move(registry, trained_model, tmp_path):
    for _ in range(3):
        register(registry, trained_model)
    assert resolve(registry, NAME).version == 3 and resolve(registry, f"{NAME}/2").version == 2

    set_alias(registry, NAME, "production", 1)
    set_alias(registry, NAME, "staging", 3)
    assert resolve(registry, f"{NAME}@production").version == 1
    moved = set_alias(registry, NAME, "production", 2)
    assert (moved.version, moved.previous_version) == (2, 1)
    assert {a: r.version for a, r in read_aliases(registry, NAME).items()} == {"production": 2, "staging": 3}
    assert load_model(f"{NAME}@production", registry, tmp_path / "cache").classes == ["blue", "green", "red"]

    with pytest.raises(ModelNotFoundError, match=r"no alias 'canary'.*\['production', 'staging'\]"):
        resolve(registry, f"{NAME}@canary")
    with pytest.raises(ModelNotFoundError, match=r"no version 9.*\[1, 2, 3\]"):
        resolve(registry, f"{NAME}/9")
    with pytest.raises(ModelNotFoundError):
        set_alias(registry, NAME, "production", 9)
    with pytest.raises(ModelNotFoundError, match="no model named 'other'"):
        resolve(registry, "other")


def test_failed_upload_leaves_no_record_and_its_number_is_not_reused(registry, trained_model, tmp_path):
    register(registry, trained_model)
    broken = shutil.copytree(trained_model, tmp_path / "broken")
    # ModelDirectory checks what scoring needs; the log goes missing once the registration has started.
    model = ModelDirectory(broken)
    (broken / "training_log.csv").unlink()
    with pytest.raises(FileNotFoundError):
        register_model(registry, NAME, model, metrics={}, params={}, datasets={})
    backend = open_backend(registry)
    assert backend.read(f"{NAME}/2/model.pt") is not None and backend.read(f"{NAME}/2/{CLAIM_FILE}") is not None
    assert backend.read(f"{NAME}/2/{REGISTRATION_FILE}") is None
    assert list_versions(registry, NAME) == [1] and resolve(registry, NAME).version == 1
    with pytest.raises(ModelNotFoundError):
        resolve(registry, f"{NAME}/2")

    registration, location = register(registry, trained_model)
    assert registration.version == 3 and list_versions(registry, NAME) == [1, 3]
    assert location.endswith(f"{NAME}/3")


def test_versions_registered_before_claims_existed_are_never_claimed_again(tmp_path, trained_model):
    first, _ = register(tmp_path, trained_model, accuracy=0.5)
    (tmp_path / NAME / "1" / CLAIM_FILE).unlink()  # the layout of registries written before claims
    assert register(tmp_path, trained_model)[0].version == 2
    assert read_registration(tmp_path, NAME, 1) == first
    for name, digest in first.files.items():
        assert sha256_file(tmp_path / NAME / "1" / name) == digest


def test_champion_challenger_promotion_is_recorded(registry, trained_model):
    first = register(registry, trained_model, accuracy=0.8, promote_to="production")[0]
    assert first.promotion.promoted and first.promotion.champion_version is None
    weaker = register(registry, trained_model, accuracy=0.7, promote_to="production")[0]
    assert not weaker.promotion.promoted and (weaker.promotion.champion_version, weaker.promotion.champion) == (1, 0.8)
    assert resolve(registry, f"{NAME}@production").version == 1
    tie = register(registry, trained_model, accuracy=0.8, promote_to="production")[0]
    assert not tie.promotion.promoted, "a challenger must beat the champion, not equal it"
    stronger = register(registry, trained_model, accuracy=0.95, promote_to="production")[0]
    assert stronger.promotion.promoted and resolve(registry, f"{NAME}@production").version == 4
    assert read_registration(registry, NAME, 2).promotion == weaker.promotion
    assert read_aliases(registry, NAME)["production"].previous_version == 1

    with pytest.raises(PipelineInputError, match=r"'f1' is not among this model's figures: \['accuracy'\]"):
        register(registry, trained_model, promote_to="production", promotion_metric="f1")
    assert list_versions(registry, NAME) == [1, 2, 3, 4], "a refused promotion claims no version"


def test_references_and_names_are_checked(tmp_path, trained_model):
    for bad in ("", "Digits", "../escape", "a/b", "x" * 101):
        with pytest.raises(InvalidModelNameError):
            register(tmp_path, trained_model, name=bad)
    for bad in ("digits/0", "digits@Prod", "digits@1x", "digits/1/2", "a@b@c"):
        with pytest.raises(InvalidModelNameError):
            resolve(tmp_path, bad)
    with pytest.raises(InvalidModelNameError, match="neither a model directory nor a registry reference"):
        load_model(str(tmp_path / "No Such Dir"), tmp_path, tmp_path / "cache")
    with pytest.raises(InvalidModelNameError):
        set_alias(tmp_path, NAME, "Production", 1)
    assert list(tmp_path.iterdir()) == []
    assert load_model(str(trained_model), tmp_path, tmp_path / "cache").root == trained_model


def test_registration_json_is_plain_json_beside_the_model_files(tmp_path, trained_model):
    registration, location = register(tmp_path, trained_model)
    record = json.loads((tmp_path / NAME / "1" / REGISTRATION_FILE).read_text())
    assert record["version"] == 1 and set(record["files"]) == {p.name for p in (tmp_path / NAME / "1").glob("*.*")} - {
        REGISTRATION_FILE, CLAIM_FILE}  # fmt: skip
    assert ModelDirectory(location).classes == ["blue", "green", "red"]


def test_default_model_name_comes_from_the_data_set():
    assert default_model_name("/data/digits/train", "resnet18") == "digits-resnet18"
    assert default_model_name("/data/My Pets.zip", "densenet121") == "my-pets-densenet121"
