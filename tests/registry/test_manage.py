"""Registry operations after registration (tag, archive, delete, unset, search, fetch) on both backends: a local
folder and the real HTTP S3 endpoint. The command line that runs them is tests/flows/test_registry.py."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.registry_layout import CLAIM_FILE, STATUS_FILE
from tasks.errors import AliasedVersionError, InvalidQueryError, ModelNotFoundError
from tasks.registry import (
    list_versions,
    open_backend,
    read_aliases,
    read_registration,
    resolve,
    set_alias,
    unset_alias,
)
from tasks.registry.manage import (
    archive,
    delete_version,
    list_models,
    model_versions,
    parse_condition,
    search,
    show_version,
    tag,
    untag,
)
from tasks.registry.status import change_status
from tasks.storage.local_files import sha256_file
from tests.helpers import NAME, register_test_model, registry_cli

pytestmark = pytest.mark.integration


def test_tags_change_and_archived_versions_leave_latest(registry, trained_model):
    for _ in range(3):
        register_test_model(registry, trained_model)
    assert tag(registry, f"{NAME}/2", {"reviewed": "yes"}).tags == {"team": "vision", "reviewed": "yes"}
    assert untag(registry, f"{NAME}/2", ["team", "absent"]).tags == {"reviewed": "yes"}
    assert show_version(registry, f"{NAME}/1").tags == {"team": "vision"}, "untouched: the registration's tags"

    assert archive(registry, f"{NAME}/3").archived
    assert resolve(registry, NAME).version == 2, "an archived version is not latest"
    assert resolve(registry, f"{NAME}/3").version == 3, "but still fetchable by number"
    set_alias(registry, NAME, "staging", 3)
    assert resolve(registry, f"{NAME}@staging").version == 3, "and by alias"
    assert list_versions(registry, NAME) == [1, 2, 3] and list_versions(registry, NAME, include_archived=False) == [
        1,
        2,
    ]
    assert [v.archived for v in model_versions(registry, NAME)] == [False, False, True]
    assert not archive(registry, f"{NAME}/3", archived=False).archived and resolve(registry, NAME).version == 3
    assert list_models(registry) == [NAME]


def test_an_aliased_version_is_not_deleted_and_a_deleted_number_is_not_reused(registry, trained_model):
    for _ in range(3):
        register_test_model(registry, trained_model)
    set_alias(registry, NAME, "production", 1)
    with pytest.raises(
        AliasedVersionError,
        match=rf"{NAME}/1 cannot be deleted .*: alias production points at it; "
        r"move the alias to another version or unset it first",
    ):
        delete_version(registry, NAME, 1)
    assert list_versions(registry, NAME) == [1, 2, 3]

    delete_version(registry, NAME, 3)
    assert list_versions(registry, NAME) == [1, 2] and resolve(registry, NAME).version == 2
    with pytest.raises(ModelNotFoundError, match=r"no version 3 .* committed versions: \[1, 2\]"):
        resolve(registry, f"{NAME}/3")
    assert open_backend(registry).list_keys(f"{NAME}/3") == [f"{NAME}/3/{CLAIM_FILE}", f"{NAME}/3/{STATUS_FILE}"]
    with pytest.raises(ModelNotFoundError):
        tag(registry, f"{NAME}/3", {"a": "b"})
    assert register_test_model(registry, trained_model)[0].version == 4, (
        "the deleted version's number is not used again"
    )

    unset_alias(registry, NAME, "production")
    assert read_aliases(registry, NAME) == {}
    with pytest.raises(ModelNotFoundError, match="no alias 'production'"):
        resolve(registry, f"{NAME}@production")
    delete_version(registry, NAME, 1)
    assert list_versions(registry, NAME) == [2, 4]
    with pytest.raises(ModelNotFoundError, match=r"no alias 'production'.*aliases: none"):
        unset_alias(registry, NAME, "production")


def test_an_alias_moved_onto_a_version_being_deleted_takes_itself_back(registry, trained_model):
    # The interleaving a deletion and an alias move can produce: the version is marked deleted after the
    # move judged it (the mark is set by hand here, as the deletion would set it) and before it checks.
    for _ in range(2):
        register_test_model(registry, trained_model)
    set_alias(registry, NAME, "production", 1)
    registration = resolve(registry, f"{NAME}/2")
    backend = open_backend(registry)
    from tasks.registry.core import _move_alias

    def mark_then_move(current):
        change_status(backend, registration, lambda s: s.model_copy(update={"deleted": True}))
        return True

    with pytest.raises(ModelNotFoundError, match=rf"{NAME}/2 is being deleted .*: alias 'production' not moved"):
        _move_alias(backend, NAME, "production", 2, mark_then_move)
    assert resolve(registry, f"{NAME}@production").version == 1


def test_deletions_racing_alias_moves_never_leave_an_alias_on_a_deleted_version(registry, trained_model):
    for _ in range(3):
        register_test_model(registry, trained_model)

    def attempt(job):
        try:
            job()
            return "done"
        except (AliasedVersionError, ModelNotFoundError) as refused:
            return type(refused).__name__

    jobs = [
        lambda: delete_version(registry, NAME, 2),
        lambda: delete_version(registry, NAME, 3),
        lambda: set_alias(registry, NAME, "production", 2),
        lambda: set_alias(registry, NAME, "staging", 3),
    ]
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(attempt, jobs))
    versions = list_versions(registry, NAME)
    for alias, record in read_aliases(registry, NAME).items():
        assert record.version in versions, f"{alias} -> deleted version {record.version} ({outcomes})"
        assert resolve(registry, f"{NAME}@{alias}").version == record.version
    for version, deleted, aliased in ((2, outcomes[0], outcomes[2]), (3, outcomes[1], outcomes[3])):
        assert not deleted == aliased == "done", f"version {version} both deleted and aliased: {outcomes}"
        assert (version in versions) == (deleted != "done")


def test_concurrent_tags_all_stay(registry, trained_model):
    register_test_model(registry, trained_model)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: tag(registry, f"{NAME}/1", {f"k{i}": str(i)}), range(8)))
    assert show_version(registry, f"{NAME}/1").tags == {"team": "vision", **{f"k{i}": str(i) for i in range(8)}}


def test_search_by_tag_and_figure(registry, trained_model):
    for accuracy in (0.7, 0.95, 0.92):
        register_test_model(registry, trained_model, accuracy=accuracy)
    register_test_model(registry, trained_model, name="other-resnet18", accuracy=0.99)
    tag(registry, f"{NAME}/3", {"data": "v2"})
    archive(registry, f"{NAME}/2")
    found = search(registry, where=[parse_condition("accuracy>=0.9")])
    assert [v.reference for v in found] == [f"{NAME}/3", "other-resnet18/1"], "archived versions are left out"
    found = search(registry, where=[parse_condition("accuracy >= 0.9")], include_archived=True, names=[NAME])
    assert [v.reference for v in found] == [f"{NAME}/2", f"{NAME}/3"]
    assert [v.reference for v in search(registry, tags={"data": "v2"})] == [f"{NAME}/3"]
    with pytest.raises(InvalidQueryError, match=r"no version records the figure 'log_loss'; figures: accuracy$"):
        search(registry, where=[parse_condition("log_loss<0.1")])  # a misspelt figure is told, not an empty result
    for bad in ("accuracy=>0.9", "accuracy>=high", "accuracy"):
        with pytest.raises(InvalidQueryError, match=rf"condition {bad!r} is not allowed: use <figure><op><number>"):
            parse_condition(bad)


def test_fetch_copies_a_version_to_a_new_folder_checked_against_its_hashes(registry, trained_model, tmp_path):
    register_test_model(registry, trained_model)
    folder = tmp_path / "fetched"
    done = registry_cli(registry, "fetch", NAME, str(folder))
    assert done.returncode == 0 and done.stdout.startswith(f"{NAME}/1 -> {folder}"), done.stderr
    registered = read_registration(registry, NAME, 1)
    assert {f: sha256_file(folder / f) for f in registered.files} == registered.files
    assert ModelDirectory(folder).classes == ["blue", "green", "red"]

    again = registry_cli(registry, "fetch", NAME, str(folder))
    assert again.returncode == 2 and "already exists and is not an empty folder" in again.stderr
    if not str(registry).startswith("s3://"):  # a local version whose weights changed is refused, nothing written
        (Path(registry) / NAME / "1" / "model.pt").write_bytes(b"changed")
        refused = registry_cli(registry, "fetch", NAME, str(tmp_path / "second"))
        assert refused.returncode == 2 and "model.pt: sha256" in refused.stderr and "registered" in refused.stderr
        assert not (tmp_path / "second").exists()
