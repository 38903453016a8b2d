"""The temporary Prefect server a command starts when PREFECT_API_URL is unset (Prefect's "ephemeral" server).

Left to Prefect, its first client call starts it: uvicorn in a subprocess writing to this process's console,
started again on another port whenever it exits with status 3 (uvicorn's status for a port it cannot bind, and
also for an application that fails to start, such as a database it cannot open) until
PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS have passed, then a timeout blamed. The command lines
(flows/cli.py) start it themselves instead:

- ``check_database``: before any work, what the server's database needs, each with its real cause: a SQLite
  file's folder exists and takes files (PREFECT_HOME, unless the URL names another), a PostgreSQL server accepts
  connections at its address.
- ``start``: the same server process (Prefect's own command, ``SubprocessASGIServer``) with its output appended to
  the command's log file, watched: one that exits is told at once with the last error it wrote; one whose port
  another process took meanwhile is started again on another. Unless the environment says otherwise, it sends no
  usage reports and has 180 s to answer (SERVER_DEFAULTS: settings of this start, not this process's environment).
  Prefect keeps one such server per process, so each of this process's clients then uses the one started here, and
  Prefect stops it when the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tasks.errors import TemporaryServerError

if TYPE_CHECKING:
    from prefect.server.api.server import SubprocessASGIServer

STARTS = "Starting temporary server"
PORT_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 5.0
ELSEWHERE = "or run a server that stays (`make server`, then export PREFECT_API_URL=http://127.0.0.1:4200/api)"
# An exception's last line in a traceback: "sqlite3.OperationalError: unable to open database file".
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b")

# What the temporary server gets unless the environment says otherwise: no usage reports, and 180 s to start (Prefect's
# 20 s is far less than its start can take on a loaded small machine: BENCHMARKS.md).
SERVER_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
}

logger = logging.getLogger("flows.temporary_server")
logger.setLevel(logging.INFO)  # its "Starting …" line is for the log file (the console filters it out)


def check_database() -> None:
    """The temporary server's database can be made (SQLite) or reached (PostgreSQL); else TemporaryServerError
    naming the cause and the setting it came from."""
    from prefect.settings import get_current_settings
    from sqlalchemy.engine import make_url

    settings = get_current_settings()
    url = make_url(settings.server.database.connection_url.get_secret_value())
    given = "connection_url" in settings.server.database.model_fields_set
    setting = "PREFECT_SERVER_DATABASE_CONNECTION_URL" if given else f"PREFECT_HOME {settings.home}"
    if url.drivername.startswith("sqlite"):
        problem = sqlite_problem(url.database, url.query)
    elif url.drivername.startswith("postgresql") and url.host:
        problem = unreachable(url.host, url.port or 5432, "PostgreSQL")
    else:  # a Unix socket, another driver: the server's start says
        problem = None
    if problem:
        raise TemporaryServerError(
            f"the temporary Prefect server this command starts cannot use its database ({setting}): {problem}; "
            f"fix it, {ELSEWHERE}"
        )


def sqlite_problem(database: str | None, query: dict) -> str | None:
    """Why a SQLite file at ``database`` cannot be made or written (None: it can, or it lives in memory)."""
    if not database or ":memory:" in database or query.get("mode") == "memory":
        return None
    path = Path(database).expanduser().absolute()
    if not path.parent.is_dir():
        missing = next(p for p in reversed([path.parent, *path.parent.parents]) if not p.is_dir())
        what = "does not exist" if not missing.exists() else "is not a folder"
        return f"{path} cannot be made: {missing} {what}"
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
        if path.exists():
            path.open("r+b").close()
    except OSError as error:
        return f"{path} cannot be written: {error.strerror or error}"
    return None


def unreachable(host: str, port: int, what: str) -> str | None:
    """Why nothing accepts a TCP connection at ``host:port`` (None: something does)."""
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        return f"no {what} answers at {host}:{port} ({error.strerror or type(error).__name__})"
    return None


def start(log_file: Path) -> None:
    """Start Prefect's temporary server, its output appended to ``log_file``, unless PREFECT_API_URL names a server
    or it is running already; TemporaryServerError when it exits before answering or does not answer in time."""
    from prefect import settings
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    if PREFECT_API_URL.value() or server.running:
        return
    # Settings, not os.environ: the server's process gets them through its environment, this one's stays as it is.
    with temporary_settings({getattr(settings, k): v for k, v in SERVER_DEFAULTS.items() if k not in os.environ}):
        _start(server, log_file)


def _start(server: SubprocessASGIServer, log_file: Path) -> None:
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    waited = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
    deadline = time.monotonic() + waited
    for _ in range(PORT_ATTEMPTS):
        server.port = server.find_available_port()
        logger.info("%s on %s (its output follows in this log)", STARTS, server.address)
        written = log_file.stat().st_size if log_file.exists() else 0
        with output_to(log_file):
            process = server._run_uvicorn_command()
        if answers(process, f"{server.api_url}/health", deadline):
            server.server_process, server.running = process, True
            atexit.register(server.stop)
            return
        if process.poll() is None:  # still starting
            process.kill()
            process.wait()
            raise TemporaryServerError(
                f"the temporary Prefect server this command starts did not answer within {waited:g} s "
                f"(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS): allow it longer, {ELSEWHERE}"
            )
        if server.is_port_available(server.port):  # it stopped for a reason of its own, not a port taken
            raise TemporaryServerError(
                f"the temporary Prefect server this command starts stopped (exit status {process.returncode}) "
                f"before answering: {last_error(log_file, written)}"
            )
    raise TemporaryServerError(
        f"the temporary Prefect server this command starts lost its port to another process {PORT_ATTEMPTS} times"
    )


@contextlib.contextmanager
def output_to(log_file: Path) -> Iterator[None]:
    """Within the block, this process's stdout and stderr descriptors write to ``log_file``: a process started
    there inherits them (Prefect's server command names no output of its own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with log_file.open("ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        yield
    finally:
        for descriptor, copy in enumerate(saved, start=1):
            os.dup2(copy, descriptor)
            os.close(copy)


def answers(process: subprocess.Popen, health_url: str, deadline: float) -> bool:
    """True once ``health_url`` answers 200; False when ``process`` ends first, or at ``deadline``."""
    import httpx

    with httpx.Client(timeout=CONNECT_TIMEOUT_S) as client:
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if client.get(health_url).status_code == 200:
                    return True
            time.sleep(0.1)
    return False


def last_error(log_file: Path, offset: int) -> str:
    """The last exception line written to ``log_file`` after ``offset`` (else its last line)."""
    with log_file.open("rb") as log:
        log.seek(offset)
        lines = [line.strip() for line in log.read().decode("utf-8", "replace").splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    return (errors or lines or ["it wrote nothing"])[-1]
