"""PostgreSQL for the Prefect server: a local cluster for a team that has none, and the check that a database URL
reaches a usable database before the server starts.

    python -m deployments.postgres start [--dir DIR] [--port 5433] [--host 127.0.0.1]   # make postgres
    python -m deployments.postgres stop [--dir DIR]                                      # make postgres-stop
    python -m deployments.postgres check                # the URL `make server` would use, checked in one line

``start`` makes the cluster on first use (``initdb``: superuser ``prefect``, a generated password in
``DIR/password``, mode 0600, scram-sha-256 for every connection, no Unix socket), starts it listening on
``--host`` only (loopback unless told), creates the ``prefect`` database with ``pg_trgm`` (Prefect's name searches
need it) and writes the server's URL to ``DIR/database-url`` (0600), which ``make server DB=postgresql`` reads.
Prefect applies its migrations when the server starts. PostgreSQL refuses to run as root: as root, its programs
run as the ``postgres`` user that Debian's package creates, and the default folder is one that user can reach.

``serve`` runs a cluster in the foreground until SIGTERM (the tests' cluster); ``--temporary`` runs it without
syncing to disk, with little WAL kept, and removes its folder afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

DEFAULT_PORT = 5433  # beside, not on, a system cluster's 5432
USER = "prefect"
DATABASE = "prefect"
SYSTEM_USER = "postgres"
CONNECT_TIMEOUT_S = 10


class PostgresError(Exception):
    """A database that cannot be made, started or reached: a user's mistake or this machine's, told in one line."""


def default_dir() -> Path:
    if os.geteuid() == 0:  # root's home is closed to the postgres user
        return Path("/var/lib/image-classifier/postgres")
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home) / "image-classifier" / "postgres"


def programs() -> Path:
    """The folder of PostgreSQL's server programs (Debian keeps them off PATH, under /usr/lib/postgresql/N/bin)."""
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent
    installed = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parent.parent.name))
    if installed:
        return installed[-1].parent
    raise PostgresError("PostgreSQL's server programs (initdb, pg_ctl) are not installed: apt-get install postgresql")


def write_private(path: Path, text: str) -> None:
    """``text`` in ``path``, mode 0600 from its creation (replaced if it exists)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text + "\n")


class Cluster:
    """One PostgreSQL cluster in ``folder``: ``data/`` (its files), ``password``, ``database-url``, ``cluster.json``
    (the address it listens on) and ``postgres.log``."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.folder = Path(folder).absolute()
        self.data = self.folder / "data"
        self.log = self.folder / "postgres.log"
        self.url_file = self.folder / "database-url"
        self.password_file = self.folder / "password"
        self.address_file = self.folder / "cluster.json"

    # -- as the postgres user when root --------------------------------------------------------------------------
    def _owner(self) -> pwd.struct_passwd | None:
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            raise PostgresError(
                f"PostgreSQL does not run as root, and this machine has no '{SYSTEM_USER}' user to run it as: "
                "run this as an ordinary user, or apt-get install postgresql (which creates that user)"
            ) from None

    def _popen_options(self) -> dict:
        owner = self._owner()
        if owner is None:
            return {}
        return {
            "user": owner.pw_uid,
            "group": owner.pw_gid,
            "extra_groups": [],
            "env": {**os.environ, "HOME": owner.pw_dir},
        }

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        """Run one of PostgreSQL's programs (as its owner); raises PostgresError with its last line on failure."""
        result = subprocess.run(
            [str(programs() / program), *args], capture_output=True, text=True, **self._popen_options()
        )
        if result.returncode != 0:
            lines = (result.stderr or result.stdout).strip().splitlines() or [f"exit {result.returncode}"]
            raise PostgresError(f"{program} failed: {lines[-1]} (see {self.log})")
        return result

    # -- making and starting ------------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return (self.data / "PG_VERSION").is_file()

    def init(self) -> None:
        """``initdb`` with a generated password, scram-sha-256 everywhere; nothing done when it exists."""
        if self.initialized:
            return
        owner = self._owner()
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if owner is not None:
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            if not os.access(self.folder, os.X_OK) or not _reachable_by(self.folder, owner):
                raise PostgresError(
                    f"the '{SYSTEM_USER}' user cannot reach {self.folder}: choose a folder it can, e.g. "
                    f"POSTGRES_DIR={default_dir()}"
                )
        password = secrets.token_urlsafe(24)
        write_private(self.password_file, password)
        handle, pwfile = tempfile.mkstemp(dir=self.folder, prefix=".pwfile-")
        try:
            with os.fdopen(handle, "w") as file:
                file.write(password + "\n")
            if owner is not None:
                os.chown(pwfile, owner.pw_uid, owner.pw_gid)
            self.run(
                "initdb", "--pgdata", str(self.data), "--username", USER, "--pwfile", pwfile,
                "--auth", "scram-sha-256", "--encoding", "UTF8", "--locale", "C", "--no-instructions",
            )  # fmt: skip
        except PostgresError:
            shutil.rmtree(self.data, ignore_errors=True)  # a half-made cluster would stop the next try
            raise
        finally:
            os.unlink(pwfile)
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\ninclude_if_exists = 'image-classifier.conf'\n")

    def configure(self, host: str, port: int, max_connections: int = 200, throwaway: bool = False) -> None:
        """Where it listens (TCP only), read at its next start. A ``throwaway`` cluster (``serve --temporary``, the
        tests': removed when it stops) neither syncs to disk nor keeps more than a little WAL: a crash may lose it
        whole, and the disk it takes stays small while the tests copy databases all run long."""
        settings = f"listen_addresses = '{host}'\nport = {port}\nunix_socket_directories = ''\n"
        settings += f"max_connections = {max_connections}\n"
        if throwaway:
            settings += (
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "wal_level = minimal\nmax_wal_senders = 0\nmin_wal_size = 32MB\nmax_wal_size = 64MB\n"
            )
        (self.data / "image-classifier.conf").write_text(settings, encoding="utf-8")
        self.address_file.write_text(json.dumps({"host": host, "port": port}), encoding="utf-8")

    @property
    def address(self) -> tuple[str, int]:
        try:
            saved = json.loads(self.address_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PostgresError(f"no PostgreSQL cluster in {self.folder}: run make postgres") from None
        host = saved["host"]
        return ("127.0.0.1" if host in ("0.0.0.0", "*", "") else host), int(saved["port"])

    def url(self, database: str = DATABASE) -> str:
        host, port = self.address
        password = self.password_file.read_text(encoding="utf-8").strip()
        return f"postgresql+asyncpg://{USER}:{quote(password, safe='')}@{host}:{port}/{database}"

    def running(self) -> bool:
        if not self.initialized:
            return False
        result = subprocess.run(
            [str(programs() / "pg_ctl"), "status", "--pgdata", str(self.data)],
            capture_output=True,
            **self._popen_options(),
        )
        return result.returncode == 0

    def start(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> str:
        """Make (first time), start in the background, create the ``prefect`` database; returns its URL."""
        self.init()
        if not self.running():
            self.configure(host, port)
            self.run("pg_ctl", "start", "--pgdata", str(self.data), "--log", str(self.log), "--wait", "--timeout", "60")
        self.prepare()
        return self.url()

    def serve(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, throwaway: bool = False) -> subprocess.Popen:
        """Make and start the cluster in the foreground (the caller stops it); returns the postgres process."""
        self.init()
        self.configure(host, port, throwaway=throwaway)
        log = open(self.log, "ab")
        process = subprocess.Popen(
            [str(programs() / "postgres"), "-D", str(self.data)],
            stdout=log,
            stderr=subprocess.STDOUT,
            **self._popen_options(),
        )
        log.close()
        for _ in range(600):
            if process.poll() is not None:
                raise PostgresError(f"postgres exited with {process.returncode} at its start (see {self.log})")
            try:
                self.prepare()
                return process
            except PostgresError:
                time.sleep(0.1)
        process.kill()
        raise PostgresError(f"postgres did not accept connections within 60 s (see {self.log})")

    def prepare(self) -> None:
        """The ``prefect`` database with pg_trgm, and the server's URL in ``database-url`` (0600)."""
        asyncio.run(self._prepare())
        write_private(self.url_file, self.url())

    async def _prepare(self) -> None:
        import asyncpg

        async with connection(self.url("postgres")) as admin:
            if not await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
                await admin.execute(f'CREATE DATABASE "{DATABASE}"')
        async with connection(self.url()) as prefect:
            try:
                await prefect.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            except asyncpg.PostgresError as error:
                raise PostgresError(f"cannot enable pg_trgm: {error} (install postgresql-contrib)") from None

    def stop(self) -> bool:
        """Stop it (fast shutdown: sessions are closed); False when it was not running."""
        if not self.running():
            return False
        self.run("pg_ctl", "stop", "--pgdata", str(self.data), "--mode", "fast", "--wait")
        return True


def _reachable_by(folder: Path, owner: pwd.struct_passwd) -> bool:
    """True when every folder above ``folder`` lets ``owner`` pass (search permission)."""
    for parent in folder.parents:
        status = parent.stat()
        if status.st_uid == owner.pw_uid:
            continue
        bits = 0o010 if status.st_gid == owner.pw_gid else 0o001
        if not status.st_mode & bits:
            return False
    return True


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deployments.postgres", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "serve", "stop", "url"):
        command = commands.add_parser(name)
        command.add_argument("--dir", type=Path, default=None, help=f"the cluster's folder (default {default_dir()})")
        if name in ("start", "serve"):
            command.add_argument("--host", default="127.0.0.1", help="the address it listens on (default loopback)")
            command.add_argument("--port", type=int, default=DEFAULT_PORT)
        if name == "serve":
            command.add_argument(
                "--temporary", action="store_true", help="no fsync, little WAL; remove the folder when stopped"
            )
    commands.add_parser("check", help="check the database URL that `make server` would use")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            from deployments.auth import DATABASE_URLS, server_environment

            env, _ = server_environment("127.0.0.1", dict(os.environ), insecure=False)
            url = next((env[name] for name in DATABASE_URLS if env.get(name)), None)
            print(check_database(url) if url else "database: SQLite (no database URL given)")
            return
        cluster = Cluster(args.dir or default_dir())
        if args.command == "start":
            cluster.start(args.host, args.port)
            listening = json.loads(cluster.address_file.read_text(encoding="utf-8"))
            print(
                f"PostgreSQL on {listening['host']}:{listening['port']}, data in {cluster.data}; "
                f"the server's URL is in {cluster.url_file}"
            )
            print("Start the Prefect server on it with: make server DB=postgresql")
        elif args.command == "stop":
            print(
                f"stopped PostgreSQL in {cluster.folder}"
                if cluster.stop()
                else f"no PostgreSQL running in {cluster.folder}"
            )
        elif args.command == "url":
            print(cluster.url())
        else:
            serve(cluster, args.host, args.port, args.temporary)
    except PostgresError as error:
        raise SystemExit(f"error: {error}") from None


def serve(cluster: Cluster, host: str, port: int, temporary: bool) -> None:
    """Run until SIGTERM or SIGINT, then stop the cluster (fast shutdown) and, if temporary, remove its folder."""
    process = cluster.serve(host, port, throwaway=temporary)
    print(cluster.url(), flush=True)

    def stop(*_) -> None:
        process.send_signal(signal.SIGINT)  # fast shutdown: open sessions are closed, not waited for

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        process.wait()
    finally:
        if temporary:
            shutil.rmtree(cluster.folder, ignore_errors=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
