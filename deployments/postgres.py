"""PostgreSQL for the Prefect server, from the command line: a local cluster for a team that has none
(deployments/postgres_cluster.py), and the check that the database URL the server would use reaches a usable
database before the server starts (deployments/database.py).

    python -m deployments.postgres start [--dir DIR] [--port 5433] [--host 127.0.0.1]   # make postgres
    python -m deployments.postgres stop [--dir DIR]                                      # make postgres-stop
    python -m deployments.postgres check                # the URL `make server` would use, checked in one line

``start`` makes the cluster on first use, starts it listening on ``--host`` only (loopback unless told), creates
the ``prefect`` database with ``pg_trgm`` and writes the server's URL to ``DIR/database-url`` (0600), which
``make server DB=postgresql`` reads. Prefect applies its migrations when the server starts.

``serve`` runs a cluster in the foreground until SIGTERM (the tests' cluster); ``--temporary`` runs it without
syncing to disk, with little WAL kept, and removes its folder afterwards.

The cluster's and the database's names are importable from here too (tests, bench/load.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from deployments.auth import DATABASE_URLS, server_environment
from deployments.database import PostgresError, check_database, connection, create_database, with_database
from deployments.postgres_cluster import DEFAULT_PORT, Cluster, default_dir, programs

# Callers outside deployments/ (tests/conftest.py, tests/deployments/test_deployments.py, bench/load.py) import
# these from here: re-exported from the modules they live in.
__all__ = [
    "Cluster",
    "PostgresError",
    "check_database",
    "connection",
    "create_database",
    "main",
    "programs",
    "with_database",
]


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
