"""Start a real Prefect server and worker on this machine (loopback), as tests and measurements need them.

    with PrefectStack(home="/tmp/prefect-home") as stack:   # server on a free 127.0.0.1 port, SQLite
        stack.cli("work-pool", "create", "gpu", "--type", "process")
        stack.start_worker("gpu")
        ...

Every process started here is stopped on exit. ``stack.env`` is the environment that points a
client (CLI, worker, flow run) at this server; ``settings`` adds Prefect settings to it (and so to the
server), e.g. ``{"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1"}``. With ``make_server`` the server
is the project's ``make server`` (its settings, and none of the client's; ``server_variables`` such as
``HOST`` are given to it), and ``stack.make`` runs the Makefile's other commands against it.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tasks.outages import RIDE_OUT_SERVER_RESTART

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# What `prefect server start` says, and ends, when its port is taken.
PORT_TAKEN = "is already in use"
# Linux's range of ephemeral ports ("32768 60999"): what free_port stays below.
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A loopback port free now, for a server of a test or a benchmark to bind moments later. Drawn at random below
    the kernel's range of ephemeral ports where it has one (Linux's ``ip_local_port_range``): the kernel hands those
    out to every outgoing connection and to every process that asks it for a free port (torchrun's stores, the
    servers other test processes start), any of which could take it in between. Elsewhere, the kernel's own pick.
    (A training's rendezvous port stays in the ephemeral range, which docs/multinode.md tells firewalls to allow.)"""
    try:
        low = int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    below = range(10_000, low) if low > 10_100 else range(0)
    for port in random.sample(below, min(100, len(below))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrefectStack:
    """A ``prefect server start`` (or ``make server``) on a free loopback port, plus what is started through it."""

    def __init__(
        self,
        home: str | os.PathLike[str],
        database_url: str | None = None,
        port: int | None = None,
        settings: dict[str, str] | None = None,
        make_server: bool = False,
        server_variables: dict[str, str] | None = None,
    ):
        self.home = Path(home)
        self.make_server = make_server
        self.server_variables = server_variables or {}
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # Workers poll every 2 s: a triggered run starts within seconds (Prefect's default is 10 s), and an idle
            # stack costs less CPU than at 1 s (BENCHMARKS.md, "Figures that used to sit in code comments").
            "PREFECT_WORKER_QUERY_SECONDS": "2",
            "PREFECT_WORKER_PREFETCH_SECONDS": "2",
            **(settings or {}),
        }
        if database_url:
            self.env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = database_url
        self._on(port or free_port())
        # A port chosen here may be taken by another process before the server binds it: the first start then
        # tries another (once the server has answered, it keeps its port: its clients know it).
        self.may_move = port is None
        self.processes: list[subprocess.Popen] = []
        self.logs = self.home / "logs"

    def _on(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.api_url = self.env["PREFECT_API_URL"] = f"{self.url}/api"

    def _spawn(
        self, name: str, *args: str, cwd: Path = PROJECT_ROOT, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        return self.spawn(name, sys.executable, "-m", "prefect", *args, cwd=cwd, env={**self.env, **(env or {})})

    def spawn(
        self, name: str, *command: str, env: dict[str, str] | None = None, cwd: Path = PROJECT_ROOT
    ) -> subprocess.Popen:
        """Start ``command`` (in the project root unless told) with this stack's environment; output to
        ``logs/<name>.log``."""
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")
        process = subprocess.Popen(
            command, env=env or self.env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.processes.append(process)
        return process

    def start(self, timeout: float = 120) -> PrefectStack:
        """Start the server and wait until it answers; on a port this stack chose that another process took
        first (the server's log says so), the first start goes on to another port, twice at most."""
        log, moves = self.logs / "server.log", 2
        while True:
            said_before = log.stat().st_size if log.is_file() else 0
            server = self._start_server()
            if self._answers(server, time.monotonic() + timeout):
                self.may_move = False
                return self
            with open(log, "rb") as said:
                said.seek(said_before)
                taken = PORT_TAKEN in said.read().decode(errors="replace")
            if not (taken and self.may_move and moves):
                self.stop()
                raise RuntimeError(f"Prefect server did not start: see {log}")
            self.processes.remove(server)
            self._on(free_port())
            moves -= 1

    def _start_server(self) -> subprocess.Popen:
        if self.make_server:
            # As a person starts it: the server finds its own URLs from HOST and PORT, not from a client's.
            env = {k: v for k, v in self.env.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL")}
            return self.make("server", "server", env=env, PORT=str(self.port), **self.server_variables)
        return self._spawn("server", "server", "start", "--host", "127.0.0.1", "--port", str(self.port))

    def _answers(self, server: subprocess.Popen, deadline: float) -> bool:
        """True once the server answers its health check; False if it ends first; raises past ``deadline``."""
        while True:
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2):
                    return True
            except OSError as error:  # not listening yet, or another process on the port (an HTTP error)
                if server.poll() is not None:
                    return False
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"Prefect server did not answer in time: see {self.logs / 'server.log'}"
                    ) from error
                time.sleep(0.5)

    def _run(self, what: str, *command: str, timeout: float, env: dict[str, str] | None = None):
        """Run ``command`` against this server, from the project root (``env`` added to the stack's); raises on
        failure, naming ``what`` with the output."""
        result = subprocess.run(
            command,
            env={**self.env, **(env or {})},
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{what} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def cli(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``prefect <args>`` against this server; raises on failure."""
        command = (sys.executable, "-m", "prefect", "--no-prompt", *args)
        return self._run(f"prefect {' '.join(args)}", *command, timeout=timeout, env=env)

    def deploy(self, timeout: float = 300) -> None:
        """What ``make deploy`` does against this server (the work pools and deployments of
        deployments/prefect.yaml); raises with the output on failure."""
        self._run("deploying deployments/prefect.yaml", sys.executable, "-m", "deployments.deploy", timeout=timeout)

    def start_worker(
        self,
        pool: str,
        name: str | None = None,
        limit: int | None = None,
        cwd: Path = PROJECT_ROOT,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        """A ``prefect worker start`` on ``pool``, taking at most ``limit`` runs at once, started in ``cwd`` (a
        folder of its own stands for another host's) with ``env`` added to the stack's (its flow runs inherit it)."""
        name = name or f"{pool}-worker-{len(self.processes)}"
        options = ["--limit", str(limit)] if limit else []
        env = {**RIDE_OUT_SERVER_RESTART, **(env or {})}  # as `make worker` (deployments/worker.py) sets them
        return self._spawn(name, "worker", "start", "--pool", pool, "--name", name, *options, cwd=cwd, env=env)

    def stop_process(self, process: subprocess.Popen, timeout: float = 20) -> None:
        """Stop one process started here (SIGTERM to its group, SIGKILL after ``timeout``)."""
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        self.processes.remove(process)

    def restart_server(self, down_s: float = 0.0, timeout: float = 300) -> float:
        """Stop the server, keep it stopped ``down_s`` seconds, start it again on the same port and database (as an
        upgrade does); returns the seconds it did not answer. The processes started through it keep running."""
        stopped = time.monotonic()
        self.stop_process(self.processes[0])
        time.sleep(max(0.0, down_s - (time.monotonic() - stopped)))
        self.start(timeout=timeout)
        self.processes.insert(0, self.processes.pop())  # the server first again: stopped last
        return time.monotonic() - stopped

    def make(self, name: str, target: str, env: dict[str, str] | None = None, **variables: str) -> subprocess.Popen:
        """Start ``make <target> VAR=value...`` against this server, with this interpreter's environment taken
        as installed (``make -o``: nothing is installed)."""
        venv = Path(sys.prefix)
        assignments = [f"{k}={v}" for k, v in {"VENV": str(venv), **variables}.items()]
        command = ["make", "--no-print-directory", "-o", str(venv / ".installed"), target, *assignments]
        return self.spawn(name, *command, env=env)

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log")))

    def stop(self) -> None:
        # Workers first: they would otherwise report the server gone.
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()

    def __enter__(self) -> PrefectStack:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
