"""The server's database chosen and checked (deployments/postgres.py, deployments/auth.py): what one function holds.
A real cluster, `make postgres` and `make server DB=postgresql` are run by tests/deployments/test_deployments.py."""

import pytest
from sqlalchemy.engine import make_url

from deployments.auth import DATABASE_URLS, SecretFileError, server_environment
from deployments.postgres import Cluster, PostgresError, check_database, with_database, write_private


@pytest.fixture
def config(tmp_path, monkeypatch):
    folder = tmp_path / "config"
    folder.mkdir()
    monkeypatch.setenv("IMAGE_CLASSIFIER_CONFIG", str(folder))
    return folder


def test_a_url_that_is_not_postgresql_is_left_to_prefect_and_another_driver_is_refused():
    assert check_database("sqlite+aiosqlite:///prefect.db") == "database: sqlite+aiosqlite"
    with pytest.raises(PostgresError, match=r"driver is postgresql\+psycopg2: Prefect needs postgresql\+asyncpg://"):
        check_database("postgresql+psycopg2://prefect:secret@db:5432/prefect")
    with pytest.raises(PostgresError, match="cannot be read"):
        check_database("not a url")


def test_another_database_of_the_same_server_keeps_the_password_whatever_it_holds():
    url = "postgresql+asyncpg://prefect:a%2Fb%40c%3Ad@db.example.org:5433/prefect"
    other = make_url(with_database(url, "restored"))
    assert (other.password, other.host, other.port, other.database) == ("a/b@c:d", "db.example.org", 5433, "restored")


def test_db_sqlite_ignores_every_database_url(config):
    write_private(config / "database-url", "postgresql+asyncpg://prefect:x@db/prefect")
    env, _ = server_environment("127.0.0.1", {DATABASE_URLS[0]: "postgresql+asyncpg://a:b@c/d"}, False, db="sqlite")
    assert not any(name in env for name in DATABASE_URLS)


def test_db_postgresql_uses_the_url_make_postgres_wrote_and_says_how_to_get_one_when_there_is_none(config, tmp_path):
    cluster = Cluster(tmp_path / "cluster")
    with pytest.raises(SecretFileError, match=r"DB=postgresql, but no database URL: .*run `make postgres` first"):
        server_environment("127.0.0.1", {}, False, db="postgresql", postgres_dir=cluster.folder)

    cluster.folder.mkdir()
    write_private(cluster.url_file, "postgresql+asyncpg://prefect:local@127.0.0.1:5433/prefect")
    env, _ = server_environment("127.0.0.1", {}, False, db="postgresql", postgres_dir=cluster.folder)
    assert env[DATABASE_URLS[0]] == "postgresql+asyncpg://prefect:local@127.0.0.1:5433/prefect"
    # The user's own database-url comes first; without DB the local cluster's is not used at all.
    write_private(config / "database-url", "postgresql+asyncpg://prefect:team@db.example.org/prefect")
    env, _ = server_environment("127.0.0.1", {}, False, db="postgresql", postgres_dir=cluster.folder)
    assert env[DATABASE_URLS[0]].endswith("@db.example.org/prefect")
    (config / "database-url").unlink()
    env, _ = server_environment("127.0.0.1", {}, False, postgres_dir=cluster.folder)
    assert DATABASE_URLS[0] not in env


def test_a_cluster_not_made_yet_is_named_as_such(tmp_path):
    with pytest.raises(PostgresError, match=r"no PostgreSQL cluster in .*: run make postgres"):
        Cluster(tmp_path / "nothing").url()
