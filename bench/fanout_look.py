"""The cost of one look of the fan-out engine (tasks/fanout/engine.py) at 200 children, on a real Prefect server:
HTTP requests sent, the look's wall time and the server's CPU time, side by side with one read per child (what a
look cost before issue 64: ``read_flow_run`` for each child).

    python -m bench.fanout_look                          # 200 children, 10 looks a side, alternating
    python -m bench.fanout_look --children 450 --looks 5 # past the server's page of 200: one request a page

A temporary server on loopback (SQLite, ``prefect server start``), one deployment of a small flow with no worker:
the children stay Scheduled, which is what a look reads most of the time (a child waiting for a worker or running
its epochs). The server's late-runs and scheduler services are off (``QUIET_SERVER``): with 200 runs that no
worker takes, marking them Late would hold SQLite's lock through the measurement, and add CPU of its own. The children are submitted through the engine (``FanOut.submit``) from a flow run, as a sweep or a
scoring submits them; on the way out the engine cancels them. Requests are counted in this process (every
``httpx.Client.send``); the server's CPU time is its process tree's user + system time (``/proc``), read before
and after the looks; each side's figures are totals over its looks divided by their number.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.harness import aligned
from deployments.local import PrefectStack

POOL, QUEUE, DEPLOYMENT = "fanout-look", "fanout-look-children", "fanout-look-child/bench"
TICKS = os.sysconf("SC_CLK_TCK")
QUIET_SERVER = {
    "PREFECT_SERVER_SERVICES_LATE_RUNS_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
}


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process under it (a server's workers), from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    tree, grown = {pid}, True
    while grown:
        below = {p for p, parent in parents.items() if parent in tree} - tree
        grown, tree = bool(below), tree | below
    return sum(times.get(p, 0.0) for p in tree)


class RequestCounter:
    """Counts every request this process sends through httpx (Prefect's clients are httpx clients)."""

    def __init__(self) -> None:
        self.count = 0
        self._send = httpx.Client.send

    def __enter__(self) -> RequestCounter:
        counter = self

        def send(client, request, *args, **kwargs):
            counter.count += 1
            return counter._send(client, request, *args, **kwargs)

        httpx.Client.send = send
        return self

    def __exit__(self, *exc_info) -> None:
        httpx.Client.send = self._send


def measure(look: Callable[[], object], looks: int, server_pid: int, counter: RequestCounter) -> dict[str, float]:
    """``looks`` calls of ``look``: requests, seconds (median) and server CPU seconds, per look."""
    sent, cpu, seconds = counter.count, tree_cpu_seconds(server_pid), []
    for _ in range(looks):
        started = time.perf_counter()
        look()
        seconds.append(time.perf_counter() - started)
    time.sleep(0.5)  # the server's last responses' bookkeeping, counted on its side
    return {
        "requests": (counter.count - sent) / looks,
        "seconds": statistics.median(seconds),
        "server_cpu_s": (tree_cpu_seconds(server_pid) - cpu) / looks,
    }


def fan_out(children: int, looks: int, server_pid: int) -> dict[str, dict[str, float]]:
    """In a flow run: ``children`` submitted through the engine, then its look and one read per child, in turn."""
    from prefect import flow, get_run_logger
    from prefect.client.orchestration import get_client

    from tasks.fanout.engine import FanOut

    @flow(name="fanout-look-parent")
    def parent() -> dict[str, dict[str, float]]:
        fan = FanOut(
            DEPLOYMENT,
            label="child",
            what="the benchmark fans out",
            queue=QUEUE,
            cancel_message="cancelled with its benchmark",
        )
        with fan, RequestCounter() as counter, get_client(sync_client=True) as client:
            submitting = time.perf_counter()
            ids = [fan.submit(key, {"x": key}).flow_run_id for key in range(children)]
            get_run_logger().info(f"{children} children submitted in {time.perf_counter() - submitting:.1f} s")
            sides: dict[str, list[dict[str, float]]] = {"engine look": [], "one read per child": []}
            for _ in range(2):  # alternating halves: both sides see the same server and database state
                sides["engine look"].append(measure(fan.look, looks // 2, server_pid, counter))
                sides["one read per child"].append(
                    measure(lambda: [client.read_flow_run(i) for i in ids], looks // 2, server_pid, counter)
                )
            return {
                name: {k: statistics.mean(h[k] for h in halves) for k in halves[0]} for name, halves in sides.items()
            }

    return parent()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=200)
    parser.add_argument("--looks", type=int, default=10, help="per side, in two alternating halves")
    args = parser.parse_args(argv)

    with (
        tempfile.TemporaryDirectory(prefix="bench-fanout-look-") as home,
        PrefectStack(home=home, settings=QUIET_SERVER) as stack,
    ):
        os.environ.update({k: v for k, v in stack.env.items() if k.startswith("PREFECT_")})
        from prefect import flow
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.actions import WorkPoolCreate

        @flow(name="fanout-look-child")
        def child(x: int, replaces_run: str | None = None) -> int:
            return x

        with get_client(sync_client=True) as client:
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
            client.create_deployment(flow_id=client.create_flow(child), name="bench", work_pool_name=POOL)
        found = fan_out(args.children, args.looks, stack.processes[0].pid)

    rows = [("per look, " + f"{args.children} children", "requests", "seconds (median)", "server CPU s")]
    for name, figures in found.items():
        rows.append((name, f"{figures['requests']:g}", f"{figures['seconds']:.3f}", f"{figures['server_cpu_s']:.3f}"))
    engine, per_child = found["engine look"], found["one read per child"]
    print(aligned(rows))
    print(
        f"engine look / one read per child: requests {engine['requests'] / per_child['requests']:.3f}x, "
        f"seconds {engine['seconds'] / per_child['seconds']:.3f}x, "
        f"server CPU {engine['server_cpu_s'] / max(per_child['server_cpu_s'], 1e-9):.3f}x"
    )


if __name__ == "__main__":
    main()
