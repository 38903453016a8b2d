"""deployments/auth.py: which server turns basic auth on and creates its secret, where clients find it, and the
one-line refusals of a secret others may read or one given on make's command line. The secured server itself (the
team's: on the network and on PostgreSQL) is tests/deployments/test_deployments.py's stack, where `make deploy`,
`make worker` and the CLI find the secret in its file, the UI asks for it and a training run leaves it nowhere."""

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.auth import (
    AUTH_FILE,
    CLIENT_AUTH,
    DATABASE_FILE,
    DATABASE_URLS,
    SERVER_AUTH,
    SecretFileError,
    client_environment,
    read_secret,
    server_environment,
)
from deployments.local import PROJECT_ROOT
from deployments.postgres_cluster import Cluster, write_private

MAKE = ["make", "--no-print-directory", "-o", f"{sys.prefix}/.installed", f"VENV={sys.prefix}"]


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("IMAGE_CLASSIFIER_CONFIG", raising=False)
    return tmp_path / "image-classifier"


def test_a_server_on_loopback_stays_open_and_one_on_the_network_creates_its_secret_once(config):
    assert server_environment("127.0.0.1", {}, insecure=False) == ({}, None)
    assert not config.exists()
    env, told = server_environment("0.0.0.0", {}, insecure=False)
    path = config / AUTH_FILE
    assert f"created {path} (mode 0600)" in told
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and env[SERVER_AUTH] == path.read_text().strip()
    user, password = env[SERVER_AUTH].split(":")
    assert user == "prefect" and len(password) >= 32
    again, told = server_environment("10.0.0.5", {}, insecure=False)
    assert again[SERVER_AUTH] == env[SERVER_AUTH] and str(path) in told and "created" not in told
    behind_a_proxy = {"PREFECT_UI_API_URL": "https://prefect.example.org/api"}
    assert server_environment("127.0.0.1", behind_a_proxy, insecure=False)[0][SERVER_AUTH] == env[SERVER_AUTH]
    # A client of a remote server takes it from the file; one of the temporary local server needs none.
    assert client_environment({"PREFECT_API_URL": "http://gpu-server:4200/api"})[CLIENT_AUTH] == env[SERVER_AUTH]
    assert CLIENT_AUTH not in client_environment({})


def test_the_opt_out_names_the_risk_and_the_environment_wins_over_the_file(config):
    env, told = server_environment("0.0.0.0", {}, insecure=True)
    assert SERVER_AUTH not in env and not config.exists()
    assert "INSECURE=1" in told and "open" in told and "run any shell command" in told
    env, told = server_environment("0.0.0.0", {SERVER_AUTH: "admin:given"}, insecure=False)
    assert env[SERVER_AUTH] == "admin:given" and told is None and not config.exists()


def test_a_secret_file_others_may_read_is_refused_in_one_line(config):
    config.mkdir()
    (config / DATABASE_FILE).write_text("postgresql+asyncpg://prefect:pw@db/prefect\n")
    (config / DATABASE_FILE).chmod(0o644)
    with pytest.raises(SecretFileError, match=r"may be read by others \(mode 0644\): run `chmod 600 "):
        read_secret(config / DATABASE_FILE)
    (config / DATABASE_FILE).chmod(0o600)
    env, _ = server_environment("127.0.0.1", {}, insecure=False)
    assert env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == "postgresql+asyncpg://prefect:pw@db/prefect"

    (config / AUTH_FILE).write_text("prefect:x\n")
    (config / AUTH_FILE).chmod(0o640)
    command = [sys.executable, "-m", "deployments.auth", "client", "--", "true"]
    environment = {**os.environ, "PREFECT_API_URL": "http://gpu-server:4200/api"}
    refused = subprocess.run(command, cwd=PROJECT_ROOT, env=environment, capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.count("\n") == 1 and "chmod 600" in refused.stderr


def test_db_sqlite_ignores_every_database_url(config):
    config.mkdir()
    write_private(config / DATABASE_FILE, "postgresql+asyncpg://prefect:x@db/prefect")
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
    config.mkdir()
    write_private(config / DATABASE_FILE, "postgresql+asyncpg://prefect:team@db.example.org/prefect")
    env, _ = server_environment("127.0.0.1", {}, False, db="postgresql", postgres_dir=cluster.folder)
    assert env[DATABASE_URLS[0]].endswith("@db.example.org/prefect")
    (config / DATABASE_FILE).unlink()
    env, _ = server_environment("127.0.0.1", {}, False, postgres_dir=cluster.folder)
    assert DATABASE_URLS[0] not in env


def test_make_refuses_a_secret_given_on_its_command_line():
    for variable in ("PREFECT_API_AUTH_STRING", "PREFECT_SERVER_DATABASE_CONNECTION_URL", "AWS_SECRET_ACCESS_KEY"):
        result = subprocess.run(
            [*MAKE, "-n", "worker", f"{variable}=x"], cwd=PROJECT_ROOT, capture_output=True, text=True
        )
        assert result.returncode != 0 and f"{variable} given to make shows in `ps`" in result.stderr


def test_make_server_on_a_port_in_use_is_one_line(config):
    """`make server` on a port another process holds: one line before Prefect starts (exit status 2; make adds its
    own line saying the recipe failed)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_DATABASE"))}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = subprocess.run(
            [*MAKE, "server", f"PORT={port}"],
            cwd=PROJECT_ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode != 0 and errors == [
        f"error: port {port} on 127.0.0.1 is already in use (a Prefect server running already?): stop what holds it, "
        f"or start this server on another port (make server PORT={port + 1})"
    ], result.stderr
    assert "Traceback" not in result.stderr and "Port" not in result.stderr, "Prefect never started"
