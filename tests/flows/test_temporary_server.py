"""The temporary Prefect server a command starts with no PREFECT_API_URL (flows/temporary_server.py): one that cannot
start is one line naming why, exit status 2, in seconds rather than after PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS;
what the server itself wrote goes to the command's log file. The checks made before it starts, one by one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.temporary_server import last_error, sqlite_problem, unreachable
from tests.helpers import write_class_folders

ROOT = Path(__file__).resolve().parents[2]


def test_a_sqlite_file_is_checked_where_it_would_be_made(tmp_path):
    assert sqlite_problem(str(tmp_path / "prefect.db"), {}) is None
    missing = tmp_path / "missing" / "dir" / "prefect.db"
    assert sqlite_problem(str(missing), {}) == f"{missing} cannot be made: {tmp_path / 'missing'} does not exist"
    (tmp_path / "a-file").write_text("")
    under_a_file = tmp_path / "a-file" / "home" / "prefect.db"
    assert (
        sqlite_problem(str(under_a_file), {}) == f"{under_a_file} cannot be made: {tmp_path / 'a-file'} is not a folder"
    )
    assert sqlite_problem("file::memory:", {"uri": "true"}) is None and sqlite_problem(None, {}) is None


def test_an_address_nothing_listens_on_is_told_with_the_reason():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        assert (
            unreachable("127.0.0.1", port, "PostgreSQL")
            == f"no PostgreSQL answers at 127.0.0.1:{port} (Connection refused)"
        )
        held.listen()
        assert unreachable("127.0.0.1", port, "PostgreSQL") is None


def test_the_last_error_is_the_last_exception_line_written_after_the_start(tmp_path):
    log = tmp_path / "command.log"
    log.write_text("ValueError: before the start\n")
    offset = log.stat().st_size
    with log.open("a") as file:
        file.write(
            'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
            "sqlite3.OperationalError: unable to open database file\n\n"
            "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) unable to open database file\n"
            "(Background on this error at: https://sqlalche.me/e/20/e3q8)\n"
            "17:00:26.963 | ERROR   | uvicorn.error - Application startup failed. Exiting.\n"
        )
    assert last_error(log, offset) == (
        "sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) unable to open database file"
    )
    log.write_text("ValueError: before the start\nthe server said this last\n")
    assert last_error(log, offset) == "the server said this last"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def damaged_database(folder: Path) -> str:
    (folder / "damaged.db").write_text("not a database, only words\n")
    return f"sqlite+aiosqlite:///{folder / 'damaged.db'}"


# (PREFECT_HOME, the database URL or None, what the one line says), each built from the test's folder.
CAUSES = {
    "a SQLite file in a folder that does not exist": lambda t: (
        t / "home",
        f"sqlite+aiosqlite:///{t / 'nonexistent' / 'dir' / 'prefect.db'}",
        ["(PREFECT_SERVER_DATABASE_CONNECTION_URL)", f"cannot be made: {t / 'nonexistent'} does not exist"],
    ),
    "a PREFECT_HOME that cannot be made": lambda t: (
        t / "a-file" / "home",
        None,
        [f"(PREFECT_HOME {t / 'a-file' / 'home'})", f"cannot be made: {t / 'a-file'} is not a folder"],
    ),
    "a PostgreSQL server that does not answer": lambda t: (
        t / "home",
        f"postgresql+asyncpg://u:p@127.0.0.1:{free_port()}/db",
        ["(PREFECT_SERVER_DATABASE_CONNECTION_URL)", "no PostgreSQL answers at 127.0.0.1:", "(Connection refused)"],
    ),
    "a SQLite file that is not a database (found by the server's start)": lambda t: (
        t / "home",
        damaged_database(t),
        ["stopped (exit status 3) before answering: ", "(sqlite3.DatabaseError) file is not a database", "full log: "],
    ),
}


STARTUP_TIMEOUT_S = 100


@pytest.mark.integration
@pytest.mark.parametrize("cause", CAUSES)
def test_a_temporary_server_that_cannot_start_is_one_line_naming_why(tmp_path, cause):
    """`image-classifier train` as a user runs it, with no PREFECT_API_URL: stderr is the one line, exit status 2,
    long before PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS (set to 100 s here, so a wait for it is told apart
    from a slow host's start); what can be checked before the start is (nothing written), and a server that stops
    while it starts is told at once, its own output in the command's log file."""
    (tmp_path / "a-file").write_text("")
    write_class_folders(tmp_path / "train", 2, classes=("red", "green"))
    home, database_url, expected = CAUSES[cause](tmp_path)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_DATABASE"))}
    environment |= {"PYTHONPATH": str(ROOT), "PREFECT_HOME": str(home)}
    environment["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = str(STARTUP_TIMEOUT_S)
    if database_url:
        environment["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url
    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("image-classifier")), "train", "--train-data", "train"]
        + ["--validation-data", "train", "--no-pretrained", "--epochs", "1"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S + 60,
    )
    took = time.monotonic() - started
    (line,) = done.stderr.splitlines()
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert line.startswith("error: the temporary Prefect server this command starts "), line
    assert all(text in line for text in expected), line
    assert "STARTUP_TIMEOUT" not in line and took < STARTUP_TIMEOUT_S, f"waited for the timeout: {took:.1f} s"
    logs = sorted((tmp_path / "runs" / "logs").glob("pipeline-*.log"))
    if "full log: " in line:
        (log,) = logs
        assert "Starting temporary server" in log.read_text() and "Traceback" in log.read_text(), "the server's output"
    else:
        assert not logs and not (tmp_path / "runs").exists(), "found before any work"
