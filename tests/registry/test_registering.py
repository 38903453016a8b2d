"""Registering a model, run against both backends: a local folder and the real HTTP S3 endpoint."""

import functools
import json
import shutil

import pytest

from tasks.contracts.model_directory import ModelDirectory
from tasks.errors import InvalidModelDirectoryError
from tasks.registry import (
    CLAIM_FILE,
    REGISTRATION_FILE,
    PromotionPolicy,
    fetch_model,
    list_versions,
    open_backend,
    read_registration,
    register_model,
    resolve,
)
from tasks.storage.local_files import sha256_file
from tests.helpers import NAME, register_test_model


def test_versions_count_up_and_carry_lineage(registry, trained_model, tmp_path):
    versions = [register_test_model(registry, trained_model)[0].version for _ in range(3)]
    assert versions == [1, 2, 3] and list_versions(registry, NAME) == [1, 2, 3]

    record = read_registration(registry, NAME, 2)
    assert record.metrics == {"accuracy": 0.9} and record.params == {"epochs": 2} and record.tags == {"team": "vision"}
    assert record.datasets["train"].content_hash == "ab" * 32 and record.flow_run_id == "run-1"
    model = fetch_model(registry, f"{NAME}/2", tmp_path / "cache")
    for name, digest in record.files.items():
        assert sha256_file(model.root / name) == digest == sha256_file(trained_model / name)
    assert model.classes == ["blue", "green", "red"], "a fetched version is a usable ModelDirectory"


def test_a_model_folder_missing_a_file_claims_no_version(registry, trained_model, tmp_path):
    register_test_model(registry, trained_model)
    broken = shutil.copytree(trained_model, tmp_path / "broken")
    # ModelDirectory checks what scoring needs; the log goes missing once the registration has started.
    model = ModelDirectory(broken)
    (broken / "training_log.csv").unlink()
    (broken / "metrics.json").unlink()
    (broken / "metrics.json").mkdir()  # present, but not a readable file
    with pytest.raises(
        InvalidModelDirectoryError,
        match=r"cannot be registered: metrics.json \(Is a directory\), "
        r"training_log.csv \(No such file",
    ):
        register_model(registry, NAME, model, metrics={}, params={}, datasets={})
    assert open_backend(registry).list_keys(f"{NAME}/2") == [], "nothing claimed, nothing uploaded"

    registration, location = register_test_model(registry, trained_model)
    assert registration.version == 2 and list_versions(registry, NAME) == [1, 2]
    assert location.endswith(f"{NAME}/2")


def test_versions_registered_before_claims_existed_are_never_claimed_again(tmp_path, trained_model):
    first, _ = register_test_model(tmp_path, trained_model, accuracy=0.5)
    (tmp_path / NAME / "1" / CLAIM_FILE).unlink()  # the layout of registries written before claims
    assert register_test_model(tmp_path, trained_model)[0].version == 2
    assert read_registration(tmp_path, NAME, 1) == first
    for name, digest in first.files.items():
        assert sha256_file(tmp_path / NAME / "1" / name) == digest


def test_registration_json_is_plain_json_beside_the_model_files(tmp_path, trained_model):
    registration, location = register_test_model(tmp_path, trained_model)
    record = json.loads((tmp_path / NAME / "1" / REGISTRATION_FILE).read_text())
    assert record["version"] == 1 and set(record["files"]) == {p.name for p in (tmp_path / NAME / "1").glob("*.*")} - {
        REGISTRATION_FILE,
        CLAIM_FILE,
    }
    assert ModelDirectory(location).classes == ["blue", "green", "red"]


def test_a_retry_after_a_failure_past_the_commit_returns_the_same_version(tmp_path, trained_model):
    registry = tmp_path / "registry"
    register_test_model(registry, trained_model, accuracy=0.5, promote_to="production")
    # The alias's lock file path taken by a folder: the commit succeeds, moving the alias fails.
    obstacle = registry / NAME / "aliases" / ".production.json.lock"
    obstacle.unlink()
    obstacle.mkdir()
    attempt = functools.partial(  # the same task run's registration, tried twice
        register_model,
        registry,
        NAME,
        ModelDirectory(trained_model),
        metrics={"accuracy": 0.9},
        params={},
        datasets={},
        promotion=PromotionPolicy(promote_to="production"),
        flow_run_id="flow-7",
        task_run_id="task-7",
    )
    with pytest.raises(IsADirectoryError):
        attempt()
    assert list_versions(registry, NAME) == [1, 2] and resolve(registry, f"{NAME}@production").version == 1
    obstacle.rmdir()

    again, _ = attempt()
    assert again.version == 2 and list_versions(registry, NAME) == [1, 2], "the retry found its own version"
    assert again.promotion.promoted and resolve(registry, f"{NAME}@production").version == 2
    assert (read_registration(registry, NAME, 2).flow_run_id, again.task_run_id) == ("flow-7", "task-7")
    other_task = register_model(
        registry,
        NAME,
        ModelDirectory(trained_model),
        metrics={},
        params={},
        datasets={},
        flow_run_id="flow-7",
        task_run_id="task-8",
    )[0]
    assert other_task.version == 3, "another task run of the same flow registers its own version"


def test_a_run_replacing_a_lost_one_finds_the_version_the_lost_run_committed(tmp_path, trained_model):
    """The lost run committed its version just before its host went; the run that replaced it (another flow run,
    its training_run_id the lost run's) gets that version back instead of a second one for the same training."""
    registry = tmp_path / "registry"

    def register(flow_run_id: str, training_run_id: str):
        return register_model(
            registry,
            NAME,
            ModelDirectory(trained_model),
            metrics={"accuracy": 0.9},
            params={},
            datasets={},
            flow_run_id=flow_run_id,
            task_run_id=f"task-of-{flow_run_id}",
            training_run_id=training_run_id,
        )[0]

    lost = register("lost", "lost")
    replacing = register("replacing", "lost")
    assert (lost.version, replacing.version) == (1, 1) and list_versions(registry, NAME) == [1]
    assert read_registration(registry, NAME, 1).training_run_id == "lost"
    # Another training, even of the same run's name and files, is a version of its own.
    assert register("another", "another").version == 2
