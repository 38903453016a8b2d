"""`make worker`: a Prefect worker for one work pool on this host, the pool created (process type) when the server
lacks it.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m deployments.worker --pool gpu --name gpu-host1 --limit 1

The server is asked first: one that does not answer, or asks for credentials not given, is one line and exit 2.
Then `prefect worker start` takes this process's place (``exec``), so that the signals a service manager sends
reach the worker itself.
"""

from __future__ import annotations

import os
import sys

from deployments.deploy import ensure_work_pools
from tasks.outages import ride_out_in_this_environment


def flags(parser) -> None:
    parser.add_argument("--pool", required=True, help="the work pool whose runs this worker takes")
    parser.add_argument("--name", help="the worker's name in the UI (Prefect's default: a random one)")
    parser.add_argument("--limit", type=int, help="flow runs it runs at once (default: no limit)")


def main(argv: list[str] | None = None) -> None:
    from flows.cli import server_command

    args = server_command("python -m deployments.worker", __doc__, argv, flags)
    for pool in ensure_work_pools([args.pool]):
        print(f"Created work pool {pool!r} (type process).", flush=True)
    ride_out_in_this_environment()  # the worker's own requests (its runs get the same from their deployment)
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", args.pool]
    command += ["--name", args.name] if args.name else []
    command += ["--limit", str(args.limit)] if args.limit is not None else []
    os.execv(sys.executable, command)


if __name__ == "__main__":
    main()
