"""The Prefect server's secrets, kept out of command lines: the API's basic-auth string and the database URL.

    python -m deployments.auth server --host 0.0.0.0 -- prefect server start --host 0.0.0.0 --port 4200
    python -m deployments.auth client -- prefect worker start --pool gpu

Each runs the command after ``--`` (``exec``: it takes this process's place) with the secrets in its
*environment*, never in its arguments, so ``ps`` shows none of them. They come from the environment when set
there, else from files only their owner may read (mode 0600) in ``${XDG_CONFIG_HOME:-~/.config}/image-classifier/``
(``IMAGE_CLASSIFIER_CONFIG`` names another folder):

- ``prefect-auth``: ``user:password`` for Prefect's basic auth (``PREFECT_SERVER_API_AUTH_STRING`` on the
  server, ``PREFECT_API_AUTH_STRING`` on clients and workers). ``server`` on an address other than loopback
  (or behind a proxy: ``PREFECT_UI_API_URL`` not on loopback) creates it with a random password on first use
  and prints its path; ``INSECURE=1`` starts an open API instead, with a warning. On loopback the server stays
  open, as Prefect starts it.
- ``database-url``: ``PREFECT_SERVER_DATABASE_CONNECTION_URL`` with its password (PostgreSQL), for ``server``;
  with ``--db postgresql`` and no such file, the one ``make postgres`` wrote (deployments/postgres_cluster.py). A
  PostgreSQL URL is checked before the server starts (deployments/database.py): one line if it cannot be reached
  or refuses the password.

A file that its group or others may read is refused with one line: the secret in it may already be known. So is
``server`` given a ``--port`` that another process holds on ``--host`` (exit status 2).
Imports nothing at its top but the standard library and ``tasks.storage.secrets`` (the rule it shares with the
online endpoint's token), so that it adds little to each command's start; the server's database modules, which it
sits above, are imported where a server needs them. ``python -m deployments.postgres check`` sits above it.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import secrets
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from tasks.storage.secrets import SecretFileError, config_dir, create_secret, is_loopback, read_secret

SERVER_AUTH = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_AUTH = "PREFECT_API_AUTH_STRING"
DATABASE_URLS = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")
AUTH_FILE = "prefect-auth"
DATABASE_FILE = "database-url"


def create_auth_string(path: Path) -> str:
    """A random ``prefect:<password>`` written to ``path``, created with mode 0600 (never opened wider)."""
    return create_secret(path, f"prefect:{secrets.token_urlsafe(32)}")


def server_environment(
    host: str, environ: dict[str, str], insecure: bool, db: str = "", postgres_dir: Path | None = None
) -> tuple[dict[str, str], str | None]:
    """The server's environment with its secrets, and what to tell the user (None: nothing). ``db``: "" (a URL
    from the environment or ``database-url`` if there is one, else SQLite), "sqlite", or "postgresql" (that URL, else
    the one ``make postgres`` wrote in ``postgres_dir``)."""
    env = dict(environ)
    folder = config_dir()
    if db == "sqlite":
        for name in DATABASE_URLS:
            env.pop(name, None)
    elif not any(env.get(name) for name in DATABASE_URLS):
        database_url = read_secret(folder / DATABASE_FILE)
        if database_url is None and db == "postgresql":
            from deployments.postgres_cluster import Cluster, default_dir

            local = Cluster(postgres_dir or default_dir()).url_file
            database_url = read_secret(local)
            if database_url is None:
                raise SecretFileError(
                    f"DB=postgresql, but no database URL: neither {folder / DATABASE_FILE} nor {local} exists "
                    "(run `make postgres` first, or write the URL of your PostgreSQL there)"
                )
        if database_url:
            env[DATABASE_URLS[0]] = database_url
    # Behind a proxy the server listens on loopback, but its UI's API address says it is reached from elsewhere.
    public_host = urlsplit(env.get("PREFECT_UI_API_URL", "")).hostname or host
    if env.get(SERVER_AUTH) or (is_loopback(host) and is_loopback(public_host)):
        return env, None
    if insecure:
        return env, (
            f"WARNING: INSECURE=1: the Prefect API on {public_host} is open. Anyone who reaches it can read every run and "
            "run any shell command on every host with a worker (a deployment's pull step or command)."
        )
    path = folder / AUTH_FILE
    auth = read_secret(path)
    told = f"Prefect API basic auth: the string in {path}; workers and clients read it there or from {CLIENT_AUTH}"
    if auth is None:
        auth = create_auth_string(path)
        told = f"Prefect API basic auth: created {path} (mode 0600); copy it to each worker and client host"
    env[SERVER_AUTH] = auth
    return env, told


def client_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment of a client or worker, with the auth string of a remote server (PREFECT_API_URL set)."""
    env = dict(environ)
    if env.get(CLIENT_AUTH) or not env.get("PREFECT_API_URL"):
        return env
    auth = env.get(SERVER_AUTH) or read_secret(config_dir() / AUTH_FILE)
    if auth:
        env[CLIENT_AUTH] = auth
    elif asks_for_auth(env["PREFECT_API_URL"]):
        raise SecretFileError(
            f"the Prefect server at {env['PREFECT_API_URL']} asks for basic auth and {config_dir() / AUTH_FILE} "
            f"is missing: copy the server's file there (mode 0600), or set {CLIENT_AUTH}"
        )
    return env


def asks_for_auth(api_url: str) -> bool:
    """True when the server answers 401 to a request without credentials (False when it cannot be reached:
    the command itself then says so)."""
    try:
        urllib.request.urlopen(f"{api_url.rstrip('/')}/admin/version", timeout=10).close()
    except urllib.error.HTTPError as error:
        return error.code == 401
    except (OSError, ValueError):
        return False
    return False


def port_taken(host: str, command: list[str]) -> str | None:
    """The one line for a server ``command`` whose ``--port`` another process holds on ``host`` (None: it is free,
    or no port is given there), found as Prefect's own start finds it."""
    given = [a.removeprefix("--port=") for a in command if a.startswith("--port=")]
    given += [after for flag, after in zip(command, command[1:]) if flag == "--port"]
    if not given or not given[-1].isdigit():
        return None
    port = int(given[-1])
    with contextlib.suppress(OSError):
        family, kind, proto, _, address = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return (
                        f"port {port} on {host} is already in use (a Prefect server running already?): stop what "
                        f"holds it, or start this server on another port (make server PORT={port + 1})"
                    )
    return None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    options, command = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="python -m deployments.auth",
        usage="%(prog)s {server,client} [--host HOST] -- COMMAND...",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("role", choices=("server", "client"))
    parser.add_argument("--host", default="127.0.0.1", help="the address the server listens on")
    parser.add_argument("--db", choices=("", "sqlite", "postgresql"), default="", help="the server's database")
    parser.add_argument("--postgres-dir", type=Path, default=None, help="the folder of `make postgres`'s cluster")
    args = parser.parse_args(options)
    if not command:
        parser.error("give the command to run after --")
    try:
        if args.role == "server":
            insecure = os.environ.get("INSECURE", "") not in ("", "0")
            env, told = server_environment(args.host, dict(os.environ), insecure, args.db, args.postgres_dir)
            if told:
                print(told, file=sys.stderr, flush=True)
            if taken := port_taken(args.host, command):
                print(f"error: {taken}", file=sys.stderr)
                raise SystemExit(2)
            database_url = next((env[name] for name in DATABASE_URLS if env.get(name)), None)
            if database_url:  # one line now, rather than a traceback from the server's start
                from deployments.database import PostgresError, check_database

                try:
                    print(check_database(database_url), file=sys.stderr, flush=True)
                except PostgresError as error:
                    raise SystemExit(f"error: {error}") from None
        else:
            env = client_environment(dict(os.environ))
    except (SecretFileError, OSError) as error:
        raise SystemExit(str(error)) from None
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:
        raise SystemExit(f"cannot run {command[0]}: {error.strerror}") from None


if __name__ == "__main__":
    main()
