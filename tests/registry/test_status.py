"""A committed version's changeable state: tags and flags changed by compare-and-swap, a deleted version refused."""

from datetime import datetime, timezone

import pytest

from tasks.contracts.registry_layout import Registration
from tasks.errors import ModelNotFoundError
from tasks.registry.backends import LocalBackend
from tasks.registry.status import change_status, is_deleted, read_status

REGISTERED = Registration(
    name="colours",
    version=2,
    created_at=datetime(2026, 1, 5, tzinfo=timezone.utc),
    metrics={},
    params={},
    datasets={},
    tags={"owner": "ada"},
    files={},
)


def tagged(key: str, value: str):
    return lambda status: status.model_copy(update={"tags": {**status.tags, key: value}})


def test_a_version_without_a_status_record_has_its_registrations_tags_and_is_not_deleted(tmp_path):
    backend = LocalBackend(tmp_path)
    assert read_status(backend, "colours", 2) is None and not is_deleted(backend, "colours", 2)
    status = change_status(backend, REGISTERED, tagged("stage", "review"))
    assert status.tags == {"owner": "ada", "stage": "review"} and not status.archived
    assert status.updated_at > REGISTERED.created_at
    assert read_status(backend, "colours", 2) == status


def test_changes_keep_what_earlier_ones_made(tmp_path):
    backend = LocalBackend(tmp_path)
    change_status(backend, REGISTERED, tagged("stage", "review"))
    change_status(backend, REGISTERED, lambda status: status.model_copy(update={"archived": True}))
    status = read_status(backend, "colours", 2)
    assert status.tags == {"owner": "ada", "stage": "review"} and status.archived


def test_a_deleted_version_is_refused_unless_its_deletion_is_taken_back(tmp_path):
    backend = LocalBackend(tmp_path)
    change_status(backend, REGISTERED, lambda status: status.model_copy(update={"deleted": True}))
    assert is_deleted(backend, "colours", 2)
    with pytest.raises(ModelNotFoundError, match=f"colours/2 was deleted from {backend.location}"):
        change_status(backend, REGISTERED, tagged("stage", "review"))
    change_status(
        backend, REGISTERED, lambda status: status.model_copy(update={"deleted": False}), refuse_deleted=False
    )
    assert not is_deleted(backend, "colours", 2)
