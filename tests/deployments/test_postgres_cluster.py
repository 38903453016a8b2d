"""deployments/postgres_cluster.py: what a cluster's folder holds before PostgreSQL is run. A real cluster is made,
started and stopped by tests/deployments/test_deployments.py (`make postgres`) and tests/conftest.py (the tests')."""

import stat

import pytest

from deployments.database import PostgresError
from deployments.postgres_cluster import Cluster, write_private


def test_a_cluster_not_made_yet_is_named_as_such(tmp_path):
    with pytest.raises(PostgresError, match=r"no PostgreSQL cluster in .*: run make postgres"):
        Cluster(tmp_path / "nothing").url()
    assert not Cluster(tmp_path / "nothing").initialized


def test_a_private_file_is_0600_from_its_creation_and_replaced_whole(tmp_path):
    path = tmp_path / "password"
    path.write_text("an old, longer secret\n")
    path.chmod(0o644)
    write_private(path, "new")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
