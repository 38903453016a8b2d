"""A registry location opens the backend it needs: a folder (resolved, so a relative one means the same folder
from any working directory) or an S3 prefix."""

from tasks.registry.backends import LocalBackend
from tasks.registry.locations import open_backend
from tasks.registry.s3 import S3Backend


def test_a_folder_opens_locally_resolved_and_an_s3_prefix_on_s3(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = open_backend("registry")
    assert isinstance(local, LocalBackend) and local.location == str(tmp_path / "registry")
    remote = open_backend("s3://models/team/registry")
    assert isinstance(remote, S3Backend) and remote.location == "s3://models/team/registry"
