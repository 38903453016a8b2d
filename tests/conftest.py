"""Fixtures: small real images, trained models, a real (temporary) Prefect server, a moto S3 server.

Markers (pyproject.toml): ``integration`` marks every test that starts a real outside component (a Prefect
server, an S3 endpoint, torchrun, a subprocess); ``slow`` one that takes seconds for another reason.
``pytest -m "not slow and not integration"`` is the fast loop."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# One compute thread per process, for this process and every one it starts (servers, flow runs, torchrun's ranks):
# the suite runs several trainings and servers at once on a few cores, and OpenMP threads that outnumber the cores
# spin while they wait, costing CPU time for nothing (BENCHMARKS.md); what the tests assert is the same either way.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from deployments.local import PROJECT_ROOT, PrefectStack, free_port  # noqa: E402
from tests.helpers import (  # noqa: E402
    FileServer,
    alive,
    run_worker,
    s3_settings,
    s3_test_bucket,
    wait_for,
    write_class_folders,
)


@pytest.fixture
def colour_source(tmp_path: Path) -> Path:
    """A class-per-folder source: 3 colour classes x 6 PNG images."""
    return write_class_folders(tmp_path / "source", per_class=6)


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """Temporary folders (archive extraction, downloads) inside tmp_path, so that anything written outside
    them is seen by the test."""
    import tempfile

    folder = tmp_path / "scratch"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture(scope="session")
def run_folder(tmp_path_factory, worker_id) -> Path:
    """The folder every test process of this run shares: pytest-xdist's processes keep their base temp folders in
    it; pytest alone uses its own."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def built_once(run_folder):
    """``built_once(name, build)``: ``build(folder)``'s paths, built by the first test process that asks and reused
    by the others (the rest wait on a lock). Session fixtures that train or convert cost the same CPU once, not once
    per process."""
    from filelock import FileLock

    def once(name: str, build: Callable[[Path], Path | tuple[Path, ...]]) -> Path | tuple[Path, ...]:
        root = run_folder / "built-once"
        root.mkdir(exist_ok=True)
        record = root / f"{name}.json"
        with FileLock(str(root / f"{name}.lock")):
            if not record.is_file():
                built = build(root / name)
                record.write_text(json.dumps([str(p) for p in built] if isinstance(built, tuple) else str(built)))
            paths = json.loads(record.read_text())
        return tuple(Path(p) for p in paths) if isinstance(paths, list) else Path(paths)

    return once


# Where the servers that every test process of a run shares are recorded (``shared_server``), under the run's folder.
SHARED_SERVERS = "shared-servers"


@pytest.fixture(scope="session")
def shared_server(run_folder):
    """``shared_server(name, start)``: the URL of the server that ``start(folder)`` starts and returns with its
    process (the leader of a session of its own), started by the first test process of the run that asks and used
    by all of them; stopped when the run ends (``pytest_sessionfinish``). One Prefect server and one S3 endpoint
    for the run instead of one per test process: each costs CPU to start and keeps costing it while idle."""
    from filelock import FileLock

    def shared(name: str, start: Callable[[Path], tuple[str, subprocess.Popen]]) -> str:
        root = run_folder / SHARED_SERVERS
        root.mkdir(exist_ok=True)
        record = root / f"{name}.json"
        with FileLock(str(root / f"{name}.lock")):
            if not record.is_file():
                url, process = start(root / name)
                record.write_text(json.dumps({"url": url, "pid": process.pid}))
            return json.loads(record.read_text())["url"]

    return shared


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stops the shared servers in the process that runs the session: pytest-xdist's controller once every test
    process has finished, or pytest alone."""
    if hasattr(session.config, "workerinput"):
        return
    root = session.config._tmp_path_factory.getbasetemp() / SHARED_SERVERS  # the run_folder of its test processes
    leaders = [json.loads(record.read_text())["pid"] for record in root.glob("*.json")]
    for leader in leaders:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGTERM)
    # Those still alive after 20 s are killed (an exited, unreaped server is not alive).
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not any(map(alive, leaders)), 20, what="the servers to stop")
    for leader in filter(alive, leaders):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGKILL)


@pytest.fixture(scope="session")
def colour_image_dirs(built_once) -> tuple[Path, Path]:
    """Converted (train, validation) ImageDirectories of the colour classes."""
    from tasks.convert.conversion import convert_to_image_directory

    def build(base: Path) -> tuple[Path, Path]:
        train = convert_to_image_directory(write_class_folders(base / "src-train", 8, seed=1), base / "train").root
        val = convert_to_image_directory(write_class_folders(base / "src-val", 4, seed=2), base / "validation").root
        return train, val

    return built_once("colours", build)


@pytest.fixture(scope="session")
def resnet_spec(built_once) -> Path:
    from tasks.contracts.model_directory import ModelSpec
    from tasks.model.untrained import write_untrained_model_directory

    return built_once(
        "spec", lambda folder: write_untrained_model_directory(folder, ModelSpec(architecture="resnet18"))
    )


@pytest.fixture(scope="session")
def trained_model(built_once, colour_image_dirs, resnet_spec) -> Path:
    """A ModelDirectory trained for real by torchrun with 2 processes (2 epochs); tests read it, never change it."""
    train, val = colour_image_dirs

    def build(folder: Path) -> Path:
        output = folder / "model"
        result = run_worker(
            *("--train", str(train), "--validation", str(val), "--model-spec", str(resnet_spec)),
            *("--output", str(output), "--epochs", "2", "--learning-rate", "0.01", "--batch-size", "4"),
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return output

    return built_once("trained", build)


@pytest.fixture(scope="session")
def digits_subset(built_once) -> tuple[Path, Path]:
    """The bundled digits, cut to 30 training and 10 validation images per class."""
    from tasks.data.datasets import export_digits

    def build(base: Path) -> tuple[Path, Path]:
        train, val = export_digits(base / "full")
        subsets = []
        for split, keep in ((train, 30), (val, 10)):
            target = base / "digits" / split.name
            for class_dir in sorted(split.iterdir()):
                for image in sorted(class_dir.iterdir())[:keep]:
                    (target / class_dir.name).mkdir(parents=True, exist_ok=True)
                    shutil.copy(image, target / class_dir.name / image.name)
            subsets.append(target)
        return subsets[0], subsets[1]

    return built_once("digits", build)


@pytest.fixture(scope="session")
def digits_image_dirs(built_once, digits_subset) -> tuple[Path, Path]:
    """The digits subset converted: 300 training and 100 validation ImageDirectory images."""
    from tasks.convert.conversion import convert_to_image_directory

    train, val = digits_subset
    return built_once(
        "digits-converted",
        lambda base: (
            convert_to_image_directory(train, base / "train").root,
            convert_to_image_directory(val, base / "val").root,
        ),
    )


def migrate(home: Path, database_url: str | None = None) -> None:
    """``prefect server database upgrade``: every migration applied to the SQLite database of ``home``, or to
    ``database_url`` (none of this process's API or database settings reach it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_DATABASE"))}
    database = {"PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url} if database_url else {}
    subprocess.run(
        [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
        env={**env, **database, "PREFECT_HOME": str(home)},
        capture_output=True,
        check=True,
    )


@pytest.fixture(scope="session")
def prefect_database(built_once) -> Path:
    """A Prefect database with every migration applied (``prefect server database upgrade``), made once: a server
    starts from a copy in well under half the CPU time it takes to migrate a new one itself."""

    def build(folder: Path) -> Path:
        folder.mkdir(parents=True)
        migrate(folder)
        return folder / "prefect.db"

    return built_once("prefect-database", build)


@pytest.fixture(scope="session")
def prefect_home(tmp_path_factory, prefect_database) -> Callable[[str | Path], Path]:
    """``prefect_home(name)``: a new PREFECT_HOME (a temporary folder, or the folder given) whose SQLite database is
    a copy of ``prefect_database``; a server started there answers in seconds."""

    def home(name: str | Path) -> Path:
        folder = Path(name) if isinstance(name, Path) else tmp_path_factory.mktemp(name)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(prefect_database, folder / "prefect.db")
        return folder

    return home


@pytest.fixture(scope="session")
def prefect_server(shared_server, prefect_home):
    """A real Prefect server on a temporary SQLite database, one for the run (``shared_server``): the flow tests of
    every test process use it, so each finds its own runs by id or name, never as the latest."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, temporary_settings

    def start(folder: Path) -> tuple[str, subprocess.Popen]:
        stack = PrefectStack(home=prefect_home(folder)).start()
        return stack.api_url, stack.processes[0]

    with temporary_settings({PREFECT_API_URL: shared_server("prefect", start)}):
        # As Prefect's test harness does: the settings hold in threads too (a flow run a test starts in a thread
        # pool would otherwise start a temporary server of its own).
        with prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
            yield
            drain_prefect_workers()


def drain_prefect_workers() -> None:
    """Send the logs and events this process still holds to the server while it is up (as Prefect's test harness does
    before it stops its server): the shared server stops when the run ends, after this process has gone."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        with contextlib.suppress(RuntimeError):  # not started: nothing was logged
            if inspect.isawaitable(result := APILogWorker.instance().drain()):
                await result
        if inspect.isawaitable(result := EventsWorker.drain_all()):
            await result

    run_coro_as_sync(drain())


@pytest.fixture(scope="session")
def postgres_template(shared_server) -> str:
    """The URL of a database with Prefect's migrations applied, in a real PostgreSQL cluster on loopback, one for
    the run (deployments/postgres.py ``serve --temporary``: its folder is removed when the run ends)."""
    import tempfile

    from deployments.postgres import create_database

    def start(folder: Path) -> tuple[str, subprocess.Popen]:
        # Not under pytest's folders: as root, the cluster runs as the postgres user, who cannot reach them.
        data = tempfile.mkdtemp(prefix="image-classifier-test-pg-")
        command = [sys.executable, "-m", "deployments.postgres", "serve", "--temporary", "--dir", data]
        server = subprocess.Popen(
            [*command, "--port", str(free_port())],
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        url = server.stdout.readline().strip()  # printed once it accepts connections
        if not url:
            raise RuntimeError(f"PostgreSQL did not start (exit {server.wait()}): see {data}/postgres.log")
        template = create_database(url, "prefect_template")
        migrate(folder, template)
        return template, server

    return shared_server("postgres", start)


@pytest.fixture(scope="session")
def postgres_database(postgres_template) -> Callable[[str], str]:
    """``postgres_database(name)``: the URL of a new database, a copy of ``postgres_template`` (migrated: a server
    starts on it at once), for the Prefect server of a fan-out test file (multi-node, sweep, sharded scoring)."""
    import uuid

    from deployments.postgres import create_database

    return lambda name: create_database(postgres_template, f"{name}_{uuid.uuid4().hex[:8]}", "prefect_template")


@pytest.fixture(scope="session")
def s3_endpoint(shared_server) -> str:
    """A real HTTP S3 endpoint on loopback, one for the run: moto's server mode in its own process
    (``tests.s3_server``). Tests make buckets of their own (``s3_bucket``)."""
    import urllib.request

    def start(folder: Path) -> tuple[str, subprocess.Popen]:
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.s3_server", "-H", "127.0.0.1", "-p", str(port)],
            cwd=PROJECT_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"

        def answered() -> str | None:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
                return "answered"
            except OSError:
                return "ended" if server.poll() is not None else None

        with contextlib.suppress(AssertionError):  # 30 s without an answer
            if wait_for(answered, 30, interval=0.2, what=f"moto on {url}") == "answered":
                return url, server
        server.kill()
        raise RuntimeError(f"moto server did not start on {url}")

    return shared_server("s3", start)


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch):
    """An empty bucket on the loopback endpoint, with AWS_ENDPOINT_URL and test credentials set; deleted with what
    it holds when the test ends."""
    for variable, value in s3_settings(s3_endpoint).items():
        monkeypatch.setenv(variable, value)
    with s3_test_bucket() as name:
        yield name


@pytest.fixture(params=["local", "s3"])
def registry(request, tmp_path):
    """A registry location: a local folder, then a prefix on the S3 endpoint."""
    if request.param == "local":
        return str(tmp_path / "registry")
    return f"s3://{request.getfixturevalue('s3_bucket')}/team/models"


# Fixtures that start an outside component (or train through torchrun): a test using one is an integration test.
INTEGRATION_FIXTURES = {"prefect_server", "s3_endpoint", "s3_bucket", "trained_model", "stack"}


# The files that take longest (longest first), handed to the xdist workers before the others:
# `make test` sends whole files in collection order (--dist loadfile --no-loadscope-reorder; xdist's default sends
# the files with most tests first, which left these few-test files to start last and the suite to end on one of
# them with the other cores idle). Order only: a stale entry costs time, never a test.
LONGEST_FILES = (
    "tests/deployments/test_deployments.py",
    "tests/flows/test_pipeline_nodes.py",
    "tests/flows/test_sweep.py",
    "tests/test_docs_commands.py",
    "tests/flows/test_score_shards.py",
    "tests/bench/test_bench.py",
    "tests/training/test_lifeline.py",
    "tests/flows/test_cli.py",
    "tests/launch/test_interrupts.py",
    "tests/training/test_distributed.py",
    "tests/test_public_api.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    first = {name: rank for rank, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))  # stable: the rest keep order


@pytest.fixture
def server():
    """A loopback HTTP server for files a test puts in ``server.files`` (a weights mirror, a download)."""
    with FileServer() as running:
        yield running


@pytest.fixture
def torch_home(tmp_path, monkeypatch) -> Path:
    """An empty torch cache; no mirror; the internet behind a proxy that is down (loopback bypasses it: the
    websockets library sends even ws:// through an https proxy, and a flow's task runs reach the server as events
    over one)."""
    from tasks.vision.weights import MIRROR_VARIABLE

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv(MIRROR_VARIABLE, raising=False)
    for variable in ("NO_PROXY", "http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{free_port()}")
    return tmp_path / "torch" / "hub" / "checkpoints"
