"""A PostgreSQL database reached by its SQLAlchemy-style URL (``postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DB``):
connected to, created beside another, and checked before the Prefect server starts on it. Every failure is a
``PostgresError`` told in one line.

Used by the server's start (deployments/auth.py), the local cluster (deployments/postgres_cluster.py), the tests'
databases and bench/load.py. Imports only the standard library at its top: asyncpg and SQLAlchemy (Prefect brings
both) are imported where a database is reached.
"""

from __future__ import annotations

import asyncio
import contextlib

CONNECT_TIMEOUT_S = 10


class PostgresError(Exception):
    """A database that cannot be made, started or reached: a user's mistake or this machine's, told in one line."""


@contextlib.asynccontextmanager
async def connection(url: str):
    """An asyncpg connection for a SQLAlchemy-style URL, every failure to connect told in one line."""
    import asyncpg
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    where = f"PostgreSQL at {parsed.host or 'localhost'}:{parsed.port or 5432}"
    try:
        conn = await asyncpg.connect(
            host=parsed.host,
            port=parsed.port,
            user=parsed.username,
            password=parsed.password,
            database=parsed.database,
            timeout=CONNECT_TIMEOUT_S,
        )
    except asyncpg.InvalidPasswordError:
        raise PostgresError(
            f"{where} refused user '{parsed.username}': wrong password (check the database URL)"
        ) from None
    except asyncpg.InvalidAuthorizationSpecificationError as error:
        raise PostgresError(f"{where} refused user '{parsed.username}': {error}") from None
    except asyncpg.InvalidCatalogNameError:
        raise PostgresError(
            f"{where} has no database '{parsed.database}': create it, or fix the database URL"
        ) from None
    except (OSError, asyncio.TimeoutError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
        raise PostgresError(f"cannot reach {where}: {reason} (is it running? make postgres starts one)") from None
    try:
        yield conn
    finally:
        await conn.close()


def with_database(url: str, database: str) -> str:
    """``url`` naming another database on the same server, as the same user."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=database).render_as_string(hide_password=False)


def create_database(url: str, name: str, template: str | None = None) -> str:
    """A new database ``name`` (a copy of ``template``) on ``url``'s server, made as ``url``'s user; its URL."""

    async def create() -> None:
        async with connection(with_database(url, "postgres")) as admin:
            copy = f' TEMPLATE "{template}"' if template else ""
            await admin.execute(f'CREATE DATABASE "{name}"{copy}')

    asyncio.run(create())
    return with_database(url, name)


def check_database(url: str) -> str:
    """One line saying what the server will use, or PostgresError saying why it cannot (a URL that is not
    PostgreSQL's is not checked here: Prefect's own start says what is wrong with it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise PostgresError(
            "the database URL cannot be read: expected postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DB"
        ) from None
    if not parsed.drivername.startswith("postgresql"):
        return f"database: {parsed.drivername}"
    if parsed.drivername != "postgresql+asyncpg":
        raise PostgresError(f"the database URL's driver is {parsed.drivername}: Prefect needs postgresql+asyncpg://")

    async def check() -> str:
        async with connection(url) as conn:
            version = await conn.fetchval("SHOW server_version")
            enabled = await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
            available = await conn.fetchval("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if not (enabled or available):
            raise PostgresError(
                f"PostgreSQL at {parsed.host}:{parsed.port} lacks pg_trgm, which Prefect needs: install postgresql-contrib"
            )
        return f"database: PostgreSQL {version.split()[0]} at {parsed.host}:{parsed.port or 5432}/{parsed.database}"

    return asyncio.run(check())
