"""deployments/database.py: a database URL read and checked before the server starts, and another database of the
same server named. A real cluster, `make postgres` and `make server DB=postgresql` are run by
tests/deployments/test_deployments.py."""

import pytest
from sqlalchemy.engine import make_url

from deployments.database import PostgresError, check_database, with_database


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
