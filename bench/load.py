"""What the Prefect server's database holds under load: short flow runs through the `default` pool, spread over 1, 2
and 4 process workers (100 runs over 4 workers, 40 over fewer), side by side on SQLite and on PostgreSQL, with the
server restarted in the middle of the 4-worker round; then a pg_dump / pg_restore of the PostgreSQL database, checked row for row.

    python -m bench.load                      # 40/40/100 runs over 1/2/4 workers, both databases (~40 min, 2 cores)
    python -m bench.load --runs 20 --fewer 10 --workers 1 4 --databases postgresql

Each run is the `load-probe` flow below: three tasks, a log line each, and an artifact: what a short flow run
writes to the database (its states, task runs, logs, events, an artifact), without a training's or a scoring's
CPU, which on a small machine would measure torch rather than the database. Each worker is a real
`prefect worker start --pool default` (a process worker: every run is a new Python process), taking at most
``--limit`` runs at once.

For each database and worker count it reports: runs created (the API acknowledged), completed, failed, crashed,
and lost (created but not in a final state when none had become final for 2 minutes); database errors ("database
is locked", SQLAlchemy's and asyncpg's errors: the log lines naming one) in the server's and the workers' logs; the latency of `/api/health`
and of a flow-run read (p50/p95, sampled every 0.25 s while the runs go on; requests that found the server down
during the restart are counted, not timed); the server's CPU-seconds; and the task runs that completed runs lack
in the server's record (each ran three).

The restart: the server is stopped once half the round's runs are final, stays stopped ``--down-s`` seconds (20),
and starts again; the table gives the whole time it did not answer. The round's deployment and workers have what
``make deploy`` and ``make worker`` give ours (deployments/engine.py, tasks/outages); ``--compare`` runs each
restart round first with Prefect's defaults instead, side by side.

    python -m bench.load --runs 100 --workers 4 --databases sqlite postgresql --compare    # BENCHMARKS.md's table
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from datetime import date
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from bench.harness import PROJECT_ROOT
from deployments.local import PrefectStack, free_port
from tasks.outages import RIDE_OUT_SERVER_RESTART

# What a database error looks like in a server's or worker's log (SQLite's lock, SQLAlchemy's and asyncpg's errors).
DATABASE_ERRORS = ("database is locked", "sqlalchemy.exc.", "OperationalError", "DBAPIError", "asyncpg.exceptions")
DEPLOYMENT = "load-probe/load"
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
TASKS_PER_RUN = 3


@task
def probe_step(index: int, step: int) -> int:
    get_run_logger().info("run %d step %d", index, step)
    return index + step


@flow(name="load-probe", persist_result=False)
def probe_flow(index: int = 0, hold_seconds: float = 0.0) -> int:
    """Three task runs, their log lines and an artifact; then ``hold_seconds`` of waiting (a test's runs overlap)."""
    total = sum(probe_step(index, step) for step in range(TASKS_PER_RUN))
    create_markdown_artifact(f"load probe {index}: {total}", key="load-probe")
    time.sleep(hold_seconds)
    return total


def cpu_seconds(pid: int) -> float:
    """CPU-seconds of ``pid`` and every live process under it, plus the children it has reaped."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pending = [pid]
    first = True
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            # utime, stime, cutime, cstime are fields 14-17 (counted from 1; two precede the split).
            total += (int(fields[11]) + int(fields[12])) / ticks
            if first:
                total += (int(fields[13]) + int(fields[14])) / ticks
            for children in Path(f"/proc/{current}/task").glob("*/children"):
                pending += [int(child) for child in children.read_text().split()]
        first = False
    return total


class Sampler(threading.Thread):
    """Times GET /api/health and a flow-run read every ``every`` seconds until stopped."""

    def __init__(self, api_url: str, every: float = 0.25):
        super().__init__(daemon=True)
        self.api_url, self.every = api_url, every
        self.run_id: str | None = None
        self.health: list[float] = []
        self.read: list[float] = []
        self.unanswered = 0
        self.stopped = threading.Event()

    def _time(self, url: str, into: list[float]) -> None:
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
        except OSError:
            self.unanswered += 1
            return
        into.append(time.perf_counter() - start)

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self._time(f"{self.api_url}/health", self.health)
            if self.run_id:
                self._time(f"{self.api_url}/flow_runs/{self.run_id}", self.read)


def percentile(values: list[float], q: int) -> float | None:
    if len(values) < 2:
        return values[0] * 1000 if values else None
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def deploy_probe(stack: PrefectStack, pool: str = "default", prefect_defaults: bool = False) -> str:
    """The probe flow as deployment ``load-probe/load`` of ``pool`` (an existing pool), with the job variables
    ``make deploy`` gives the project's deployments (deployments/deploy.py), or none (``prefect_defaults``)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.deploy import run_job_variables

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("load-probe")
        deployment_id = client.create_deployment(
            flow_id=flow_id,
            name="load",
            work_pool_name=pool,
            entrypoint="bench/load.py:probe_flow",
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(PROJECT_ROOT)}}],
            job_variables={} if prefect_defaults else run_job_variables({}),
        )
    return str(deployment_id)


def create_runs(
    stack: PrefectStack, deployment_id: str, runs: int, ids: list[str], errors: list[str], retries: int
) -> None:
    """Create ``runs`` flow runs of the probe (Prefect's client retries each call ``retries`` times), appending the
    ids the API acknowledged to ``ids`` and why a run could not be created to ``errors``."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    settings = {PREFECT_API_URL: stack.api_url, PREFECT_CLIENT_MAX_RETRIES: retries}
    with temporary_settings(settings), get_client(sync_client=True) as client:
        for index in range(runs):
            try:
                ids.append(str(client.create_flow_run_from_deployment(deployment_id, parameters={"index": index}).id))
            except Exception as error:  # counted, and the round goes on: what the load did is the measurement
                errors.append(f"{type(error).__name__}: {error}"[:200])


def read_runs(stack: PrefectStack, ids: list[str]) -> list:
    """The flow runs ``ids`` as the server has them now."""
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[uuid.UUID(i) for i in ids])), limit=len(ids) + 1
        )


def task_runs_missing(stack: PrefectStack, runs: list) -> int:
    """How many task runs the completed ``runs`` lack in the server's record: each ran ``TASKS_PER_RUN``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    completed = [run.id for run in runs if run.state and run.state.is_completed()]
    recorded: dict = {}
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        for start in range(0, len(completed), 50):
            for task_run in client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=completed[start : start + 50])), limit=200
            ):
                recorded[task_run.flow_run_id] = recorded.get(task_run.flow_run_id, 0) + 1
    return sum(max(0, TASKS_PER_RUN - recorded.get(run_id, 0)) for run_id in completed)


def states_of(runs: list) -> dict[str, str]:
    return {str(run.id): run.state_type.value if run.state_type else "NONE" for run in runs}


def final_messages(runs: list) -> dict[str, int]:
    """How many of ``runs`` ended Crashed or Failed with each state message."""
    messages = [
        f"{r.state.name}: {(r.state.message or '')[:160]}" for r in runs if r.state.is_crashed() or r.state.is_failed()
    ]
    return {message: messages.count(message) for message in set(messages)}


def database_errors(logs: list[Path]) -> tuple[int, str | None]:
    """How many lines of ``logs`` name a database error (a traceback names one in two or three), and the first."""
    lines = [line for path in logs if path.is_file() for line in path.read_text(errors="replace").splitlines()]
    found = [line for line in lines if any(pattern in line for pattern in DATABASE_ERRORS)]
    return len(found), (found[0][:300] if found else None)


def one_round(
    home: Path,
    database_url: str | None,
    workers: int,
    runs: int,
    limit: int,
    restart: bool,
    down_s: float = 0.0,
    prefect_defaults: bool = False,
) -> dict:
    """One round; ``prefect_defaults``: the deployment and workers without the project's settings for riding out
    a restart (deployments/engine.py, tasks/outages), as before them."""
    settings = {"OMP_NUM_THREADS": "1", "PREFECT_LOGGING_LEVEL": "INFO"}
    # A round ends when every run is final, or when none became final for this long (the restart's outage aside).
    stall_s = 120 + (down_s if restart else 0)
    stack = PrefectStack(home=home, database_url=database_url, settings=settings).start(timeout=300)
    server_cpu = 0.0
    try:
        stack.cli("work-pool", "create", "default", "--type", "process")
        deployment_id = deploy_probe(stack, prefect_defaults=prefect_defaults)
        worker_env = {"PREFECT_CLIENT_MAX_RETRIES": "5"} if prefect_defaults else None  # Prefect's default: 5
        for index in range(workers):
            stack.start_worker("default", f"worker-{index}", limit=limit, env=worker_env)
        sampler = Sampler(stack.api_url)
        sampler.start()
        started = time.monotonic()
        # Created from a thread while the round is watched: the restart comes once half the runs are final.
        ids: list[str] = []
        create_errors: list[str] = []
        # The client that creates them retries as a command line of ours does (tasks/outages), or as Prefect's.
        retries = 5 if prefect_defaults else int(RIDE_OUT_SERVER_RESTART["PREFECT_CLIENT_MAX_RETRIES"])
        creating = threading.Thread(target=create_runs, args=(stack, deployment_id, runs, ids, create_errors, retries))
        creating.start()
        while not ids and creating.is_alive():
            time.sleep(0.1)
        sampler.run_id = ids[0] if ids else None
        restarted_after = None
        done, progressed = 0, time.monotonic()
        while time.monotonic() - progressed < stall_s:
            with contextlib.suppress(Exception):
                states = states_of(read_runs(stack, list(ids)))  # a copy: the creating thread appends
                now_done = sum(state in FINAL for state in states.values())
                if now_done > done:
                    done, progressed = now_done, time.monotonic()
                if done == len(ids) and not creating.is_alive():
                    break
                if restart and restarted_after is None and done >= runs // 2:
                    server_cpu += cpu_seconds(stack.processes[0].pid)
                    restarted_after = (done, stack.restart_server(down_s))
            time.sleep(1)
        elapsed = time.monotonic() - started
        sampler.stopped.set()
        sampler.join()
        creating.join()
        runs_now = read_runs(stack, ids)
        states = states_of(runs_now)
        messages = final_messages(runs_now)
        # The server records task runs from their events, a moment after the flow run's final state.
        settled = time.monotonic() + 30
        while (missing := task_runs_missing(stack, runs_now)) and time.monotonic() < settled:
            time.sleep(3)
        server_cpu += cpu_seconds(stack.processes[0].pid)
    finally:
        stack.stop()
    counts = {state.lower(): sum(s == state for s in states.values()) for state in FINAL}
    unfinished = sorted(s for s in states.values() if s not in FINAL)
    server_errors = database_errors([stack.logs / "server.log"])
    worker_errors = database_errors(sorted(stack.logs.glob("worker-*.log")))
    return {
        "client": "Prefect's defaults" if prefect_defaults else "ours",
        "workers": workers,
        "runs": runs,
        "created": len(ids),
        **counts,
        "lost": len(ids) - sum(counts.values()),
        "task_runs_missing": missing,
        "lost_states": {state: unfinished.count(state) for state in set(unfinished)},
        "crashed_or_failed": messages,
        "not_created": {error: create_errors.count(error) for error in set(create_errors)},
        "server_db_errors": server_errors[0],
        "worker_db_errors": worker_errors[0],
        "first_db_error": server_errors[1] or worker_errors[1],
        "health_p50_ms": percentile(sampler.health, 50),
        "health_p95_ms": percentile(sampler.health, 95),
        "read_p50_ms": percentile(sampler.read, 50),
        "read_p95_ms": percentile(sampler.read, 95),
        "unanswered": sampler.unanswered,
        "server_cpu_s": round(server_cpu, 1),
        "seconds": round(elapsed, 1),
        "restart": None
        if restarted_after is None
        else {"after_runs": restarted_after[0], "down_s": round(restarted_after[1], 1)},
    }


def plain(url: str) -> tuple[str, dict[str, str]]:
    """A libpq URL (no driver, no password) and the environment holding the password, for pg_dump / pg_restore."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return (
        f"postgresql://{parsed.username}@{parsed.host}:{parsed.port}/{parsed.database}",
        {**os.environ, "PGPASSWORD": parsed.password or ""},
    )


def dump_and_restore(url: str, folder: Path) -> dict:
    """pg_dump the database at ``url`` (custom format), pg_restore it into a new one, and compare row counts."""
    import asyncio

    from deployments.postgres import connection, create_database, programs

    source, env = plain(url)
    dump = folder / "prefect.dump"
    start = time.monotonic()
    subprocess.run([str(programs() / "pg_dump"), "--format=custom", "--file", str(dump), source], env=env, check=True)
    dumped = time.monotonic() - start
    restored_url = create_database(url, "restored")
    target, _ = plain(restored_url)
    start = time.monotonic()
    subprocess.run([str(programs() / "pg_restore"), "--no-owner", "--dbname", target, str(dump)], env=env, check=True)
    restore_s = time.monotonic() - start

    async def counts(database_url: str) -> dict[str, int]:
        async with connection(database_url) as conn:
            return {
                t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in ("flow_run", "task_run", "log", "artifact")
            }

    before, after = asyncio.run(counts(url)), asyncio.run(counts(restored_url))
    return {
        "dump_mb": round(dump.stat().st_size / 1e6, 2),
        "dump_s": round(dumped, 1),
        "restore_s": round(restore_s, 1),
        "rows": before,
        "equal": before == after,
    }


def measure(
    runs: int,
    worker_counts: list[int],
    databases: list[str],
    limit: int,
    fewer: int,
    down_s: float = 20.0,
    compare: bool = False,
    keep: bool = False,
) -> dict:
    """Every round; with ``compare``, each restart round is run first with Prefect's defaults, side by side."""
    from deployments.postgres import Cluster, create_database

    results: dict = {"runs": runs, "limit": limit, "rounds": {}}
    scratch = Path(tempfile.mkdtemp(prefix="bench-load-"))
    cluster_dir = Path(tempfile.mkdtemp(prefix="bench-load-pg-"))  # reachable by the postgres user when root
    postgres = None
    try:
        if "postgresql" in databases:
            postgres = Cluster(cluster_dir).serve(port=free_port())
        for database in databases:
            for workers in worker_counts:
                restart = workers == max(worker_counts)
                count = runs if restart else min(fewer, runs)  # the full load where it counts: the most workers
                for prefect_defaults in (True, False) if compare and restart else (False,):
                    name = f"{database}-{workers}{'-prefect-defaults' if prefect_defaults else ''}"
                    url = None
                    if database == "postgresql":
                        url = create_database(Cluster(cluster_dir).url(), name.replace("-", "_"))
                    print(
                        f"{name}: {count} runs over {workers} worker(s){' with a restart' if restart else ''} ...",
                        flush=True,
                    )
                    outcome = one_round(scratch / name, url, workers, count, limit, restart, down_s, prefect_defaults)
                    print(json.dumps(outcome), flush=True)
                    results["rounds"][name] = outcome
                if database == "postgresql" and workers == max(worker_counts):
                    results["backup"] = dump_and_restore(url, scratch)
                    print("pg_dump / pg_restore:", json.dumps(results["backup"]), flush=True)
    finally:
        if postgres is not None:
            postgres.send_signal(signal.SIGINT)
            postgres.wait(timeout=60)
        shutil.rmtree(cluster_dir, ignore_errors=True)
        if keep:
            print(f"the rounds' servers' and workers' logs: {scratch}/<round>/logs", flush=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return results


def milliseconds(r: dict, what: str) -> str:
    p50, p95 = r[f"{what}_p50_ms"], r[f"{what}_p95_ms"]
    return f"{p50:.0f} / {p95:.0f}" if p50 is not None and p95 is not None else "-"


def table(results: dict) -> str:
    header = (
        "| database | client settings | workers | created | completed | failed | crashed | lost | task runs missing "
        "| DB errors (server/workers) | health p50/p95 ms | run read p50/p95 ms | server CPU-s | restart |\n|"
        + "---|"
        * 14
    )
    rows = []
    for name, r in results["rounds"].items():
        database = name.split("-", 1)[0]

        restart = f"after {r['restart']['after_runs']} runs, {r['restart']['down_s']} s down" if r["restart"] else ""
        rows.append(
            f"| {database} | {r['client']} | {r['workers']} | {r['created']} | {r['completed']} | {r['failed']} "
            f"| {r['crashed']} | {r['lost']} | {r['task_runs_missing']} | {r['server_db_errors']} / {r['worker_db_errors']} | {milliseconds(r, 'health')} | {milliseconds(r, 'read')} | {r['server_cpu_s']} | {restart} |"
        )
    return "\n".join([header, *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="flow runs in the round with the most workers")
    parser.add_argument("--fewer", type=int, default=40, help="flow runs in the other rounds")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="process workers per round")
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    parser.add_argument("--limit", type=int, default=2, help="runs one worker takes at once")
    parser.add_argument(
        "--down-s", type=float, default=20.0, help="seconds the server stays stopped before it starts again"
    )
    parser.add_argument(
        "--compare", action="store_true", help="run each restart round first with Prefect's client defaults"
    )
    parser.add_argument("--keep", action="store_true", help="keep the rounds' logs (their folder is printed)")
    args = parser.parse_args()
    results = measure(
        args.runs, args.workers, args.databases, args.limit, args.fewer, args.down_s, args.compare, args.keep
    )
    print(table(results))
    if "backup" in results:
        print(f"pg_dump / pg_restore: {json.dumps(results['backup'])}")
    out = PROJECT_ROOT / "bench" / "results" / f"{date.today()}-load.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
