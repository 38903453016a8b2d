"""A local PostgreSQL cluster for the Prefect server, in one folder: made on first use (``initdb``: superuser
``prefect``, a generated password in ``DIR/password``, mode 0600, scram-sha-256 for every connection, no Unix
socket), listening on one address only (loopback unless told), with the ``prefect`` database and ``pg_trgm``
(Prefect's name searches need it) and the server's URL in ``DIR/database-url`` (0600), which
``make server DB=postgresql`` reads. PostgreSQL refuses to run as root: as root, its programs run as the
``postgres`` user that Debian's package creates, and the default folder is one that user can reach.

``python -m deployments.postgres`` (deployments/postgres.py) is its command line; the server's start
(deployments/auth.py) finds its URL here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from deployments.database import PostgresError, connection

DEFAULT_PORT = 5433  # beside, not on, a system cluster's 5432
USER = "prefect"
DATABASE = "prefect"
SYSTEM_USER = "postgres"


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
