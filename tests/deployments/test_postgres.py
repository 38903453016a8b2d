"""deployments/postgres.py, the command line: `check` names the database `make server` would use, and a command on
a cluster not made says so in one line. A real cluster, `make postgres` and `make server DB=postgresql` are run by
tests/deployments/test_deployments.py; the cluster and the database check alone by test_postgres_cluster.py and
test_database.py."""

import pytest

from deployments.auth import DATABASE_URLS, SERVER_AUTH
from deployments.postgres import main


@pytest.fixture
def environment(tmp_path, monkeypatch):
    """No database URL and no auth string from the environment; an empty folder of secrets."""
    monkeypatch.setenv("IMAGE_CLASSIFIER_CONFIG", str(tmp_path / "config"))
    for name in (*DATABASE_URLS, SERVER_AUTH, "PREFECT_UI_API_URL"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_check_names_the_database_the_server_would_use(environment, capsys):
    main(["check"])
    assert capsys.readouterr().out == "database: SQLite (no database URL given)\n"
    environment.setenv(DATABASE_URLS[0], "sqlite+aiosqlite:///prefect.db")
    main(["check"])
    assert capsys.readouterr().out == "database: sqlite+aiosqlite\n"
    environment.setenv(DATABASE_URLS[0], "postgresql+psycopg2://prefect:secret@db:5432/prefect")
    with pytest.raises(SystemExit, match=r"^error: the database URL's driver is postgresql\+psycopg2"):
        main(["check"])


def test_a_command_on_a_cluster_not_made_is_one_line(environment, tmp_path):
    with pytest.raises(SystemExit, match=r"^error: no PostgreSQL cluster in .*: run make postgres$"):
        main(["url", "--dir", str(tmp_path / "nothing")])
