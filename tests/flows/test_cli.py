"""The command lines as a user runs them (``python -m flows.pipeline`` / ``flows.score`` in a subprocess): a
user's mistake is one line on stderr, exit status 2, no traceback, found before any work where it can be, and
never retried; the full log goes to the run's log file."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import NAME, main_in_process, register_test_model, write_class_folders

pytestmark = pytest.mark.integration  # subprocesses

ROOT = Path(__file__).resolve().parents[2]


def command(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=300,
    )


def in_process(module: str, *args: str, cwd: Path, monkeypatch) -> subprocess.CompletedProcess:
    """``python -m <module> <args>`` in ``cwd`` as its ``main(argv)`` in this process (tests.helpers.main_in_process):
    for the mistakes a command finds before any run. The tests that run a new Python assert what only it shows."""
    import importlib

    monkeypatch.chdir(cwd)
    return main_in_process(importlib.import_module(module).main, list(args))


def one_line_mistake(done: subprocess.CompletedProcess, *expected: str) -> str:
    """The mistake's line: the only line on stderr that says 'error:', with no traceback; exit status 2."""
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    assert all(text in errors[0] for text in expected), errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def mistakes(tmp_path_factory) -> Path:
    """A working folder with a training set and a validation set whose classes differ."""
    folder = tmp_path_factory.mktemp("mistakes")
    write_class_folders(folder / "train", 2, classes=("red", "green"))
    write_class_folders(folder / "val", 2, classes=("red", "blue"), seed=1)
    return folder


def test_a_missing_training_folder_is_one_line_before_any_run(mistakes):
    done = command("flows.pipeline", "--train-data", "nope", "--validation-fraction", "0.2", cwd=mistakes)
    one_line_mistake(done, "error: the training data 'nope' does not exist", str(mistakes / "nope"))
    assert done.stderr.count("\n") == 1, "no Prefect run was started"
    assert not (mistakes / "runs").exists() and not (mistakes / "registry").exists(), "nothing written"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--search-space", '{"batch_size": {"kind": "int", "low": 0, "high": 8}}'],
            "search space: batch_size: 0 is not allowed: Input should be greater than 0",
        ),
        (
            ["--search-space", '{"learning_rate": {"kind": "log_uniform", "low": 0.1, "high": 0.01}}'],
            "search space: learning_rate: the range from 0.1 to 0.01 is inverted",
        ),
        (["--trials", "2", "--parallel", "3"], "parallel 3 is more than trials 2"),
        (["--metric", "f1"], "argument --metric: invalid choice: 'f1'"),
        (["--resume", "runs/nowhere"], "resume 'runs/nowhere' is not a sweep's run folder: it holds no sweep/"),
    ],
)
def test_a_sweep_that_cannot_run_is_one_line_before_any_trial(mistakes, flags, expected, monkeypatch):
    arguments = ("flows.sweep", "--train-data", "train", "--validation-data", "train", *flags)
    if flags[0] == "--trials":  # one in a new Python, as a user runs it: nothing else on the console
        done = command(*arguments, cwd=mistakes)
        assert done.stderr.count("\n") == 1, done.stderr
    else:
        done = in_process(*arguments, cwd=mistakes, monkeypatch=monkeypatch)
    one_line_mistake(done, expected)
    assert not (mistakes / "runs").exists(), "nothing written"


def test_classes_that_differ_between_train_and_validation_are_one_line_before_any_run(mistakes, monkeypatch):
    done = in_process(
        "flows.pipeline", "--train-data", "train", "--validation-data", "val", cwd=mistakes, monkeypatch=monkeypatch
    )
    one_line_mistake(done, "only in training ['green'], only in validation ['blue']")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--architecture", "resnet1"],
            "argument --architecture: 'resnet1' is not one of the 75 choices (did you mean",
        ),
        (["--device", "gpu"], "argument --device: invalid choice: 'gpu' (choose from"),
        (["--epochs", "0"], "epochs: Input should be greater than 0"),
        (["--architecture", "densenet121", "--zero-init-residual"], "zero_init_residual"),
        (["--pretrained", "--weights-path", "nope.pth"], "weights_path nope.pth for resnet18 does not exist"),
        (["--near-duplicate-distance", "40"], "near_duplicate_distance 40 is not allowed: give the largest number"),
        (["--warm-start", "digits@production"], "no model named 'digits'"),
        (["--warm-start", "digits/1", "--pretrained"], "pretrained is true and warm_start is digits/1"),
    ],
)
def test_a_misspelt_or_impossible_parameter_is_argparse_or_pydantic_in_one_line(mistakes, flags, expected, monkeypatch):
    done = in_process("flows.pipeline", *flags, cwd=mistakes, monkeypatch=monkeypatch)
    one_line_mistake(done, expected)
    assert done.stderr.count("\n") == 1


def test_an_unknown_model_is_one_line_listing_the_models_before_converting(mistakes, trained_model, tmp_path):
    registry = tmp_path / "registry"
    register_test_model(registry, trained_model)
    done = command(
        "flows.score", str(mistakes / "val"), f"{NAME}x@production", "--registry", str(registry), cwd=tmp_path
    )
    one_line_mistake(done, f"no model named '{NAME}x'", f"did you mean '{NAME}'", f"models: {NAME}")
    assert done.stderr.count("\n") == 1 and not (tmp_path / "runs").exists(), "nothing converted"


def test_a_mistake_found_inside_the_run_is_one_line_not_retried_and_fully_logged(prefect_server, mistakes, tmp_path):
    """Archives are checked by their stage: the flow runs, validation fails once, and Prefect's failure lines and
    tracebacks go to the log file and the API, not the console."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL

    for name in ("train", "val"):
        with zipfile.ZipFile(tmp_path / f"{name}.zip", "w") as archive:
            for image in sorted((mistakes / name).rglob("*.png")):
                archive.write(image, image.relative_to(mistakes / name))
    done = command(
        "flows.pipeline",
        *("--train-data", "train.zip", "--validation-data", "val.zip", "--no-pretrained"),
        cwd=tmp_path,
        env={"PREFECT_API_URL": PREFECT_API_URL.value()},
    )
    line = one_line_mistake(done, "only in training ['green'], only in validation ['blue']", "(full log: ")
    assert "Failed(" not in done.stderr and "ERROR" not in done.stderr, "Prefect's failure lines: in the log only"
    assert done.stderr.count("\n") <= 12, done.stderr  # the run's progress (INFO), then the one line
    log = Path(line.rsplit("(full log: ", 1)[1].rstrip(")"))
    assert log.is_relative_to(tmp_path / "runs" / "logs")
    assert "Traceback" in log.read_text() and "Finished in state Failed" in log.read_text()

    # The server is the run's (shared with the other test processes): this run is found by the name its log gives.
    name = re.search(r"Beginning flow run '([^']+)'", log.read_text()).group(1)
    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
        task_runs = client.read_task_runs(flow_run_filter=_runs_of(flow_run.id))
    assert flow_run.state.is_failed() and flow_run.run_count == 1
    failed = [t for t in task_runs if t.state.is_failed()]
    assert [t.name.rsplit("-", 1)[0] for t in failed] == ["validate_labels"] and failed[0].run_count == 1


def _runs_of(flow_run_id):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))


def test_a_prefect_server_that_does_not_answer_is_one_line_before_any_work(mistakes, server, tmp_path, monkeypatch):
    """PREFECT_API_URL naming no server, or something that is not a Prefect API, and deployments with no server
    named: one line that says what to do, exit 2, before anything is converted, trained or deployed."""
    from deployments.local import free_port

    nobody = f"http://127.0.0.1:{free_port()}/api"
    data = ("--train-data", str(mistakes / "train"), "--validation-data", str(mistakes / "train"))
    done = command("flows.pipeline", *data, cwd=tmp_path, env={"PREFECT_API_URL": nobody})
    one_line_mistake(done, f"no Prefect server answers at {nobody} (PREFECT_API_URL)", "make server", "unset")
    assert not list(tmp_path.iterdir()), "nothing is written before the server answers"

    not_prefect = server.url
    done = command("deployments.deploy", cwd=tmp_path, env={"PREFECT_API_URL": not_prefect})
    one_line_mistake(done, f"{not_prefect} answered HTTP 404 when asked for its Prefect version", "ends in /api")

    for module in (["deployments.deploy"], ["deployments.serve"], ["deployments.worker", "--pool", "gpu"]):
        done = in_process(*module, cwd=ROOT, monkeypatch=monkeypatch)
        one_line_mistake(done, "PREFECT_API_URL is not set", "make server")
    shown = in_process("deployments.deploy", "--help", cwd=tmp_path, monkeypatch=monkeypatch)
    assert shown.returncode == 0 and "leaves each schedule switched on or off" in shown.stdout


def test_a_temporary_server_that_does_not_start_is_one_line_and_its_start_stays_off_the_console(mistakes, tmp_path):
    """No PREFECT_API_URL: the command starts Prefect's temporary server. Given 1 s (the default is 180 s, from a
    start measured on a loaded machine) it cannot answer: one line saying what to do, exit 2, no traceback;
    Prefect's "Starting temporary server … See https://…" lines went to the log file, not the console."""
    environment = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    environment |= {"PYTHONPATH": str(ROOT), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "1"}
    data = ("--train-data", str(mistakes / "train"), "--validation-data", str(mistakes / "train"))
    done = subprocess.run(
        [sys.executable, "-m", "flows.pipeline", *data],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    one_line_mistake(done, "the temporary Prefect server this command starts did not answer within 1 s", "make server")
    assert "Starting temporary server" not in done.stdout + done.stderr
    (log,) = (tmp_path / "runs" / "logs").glob("pipeline-*.log")
    assert "Starting temporary server" in log.read_text() and "TemporaryServerError: " in log.read_text()


def test_a_training_that_diverges_is_one_line_naming_the_run_and_its_log(prefect_server, mistakes, tmp_path):
    """A run that fails at runtime (a learning rate no network survives: the loss is NaN by the second batch) is one
    line naming the run and its log, exit status 1. Prefect's failure lines and their tracebacks go to the log file,
    not the console (the training's own lines, streamed as it runs, stay)."""
    from prefect.settings import PREFECT_API_URL

    data = ("--train-data", str(mistakes / "train"), "--validation-data", str(mistakes / "train"), "--no-pretrained")
    diverging = (
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--image-size",
        "32",
        "--device",
        "cpu",
        "--learning-rate",
        "1e9",
    )
    done = command("flows.pipeline", *data, *diverging, cwd=tmp_path, env={"PREFECT_API_URL": PREFECT_API_URL.value()})
    assert done.returncode == 1, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "error:" in line]
    told = re.fullmatch(
        r"error: run '([\w-]+)' failed: training diverged: lower the learning rate: .+ \(full log: (.+)\)", line
    )
    assert told, line
    assert "Finished in state Failed" not in done.stderr and "Encountered exception" not in done.stderr, done.stderr
    log = Path(told[2]).read_text()
    assert f"Beginning flow run '{told[1]}'" in log and "tasks.errors.TrainingDivergedError: training diverged" in log


def test_the_console_drops_what_is_told_in_one_line_and_keeps_our_own_failures():
    """The filter on Prefect's console handler (the log file and the API get every record)."""
    from flows.cli import HideFailuresToldInOneLine
    from tasks.errors import SweepFailedError

    def shown(name: str, message: str, level: int = logging.INFO, error: Exception | None = None) -> bool:
        exc_info = (type(error), error, None) if error else None
        return HideFailuresToldInOneLine().filter(logging.LogRecord(name, level, "", 0, message, None, exc_info))

    failed = "Finished in state Failed('Flow run encountered an exception: {}: …')"
    assert not shown("prefect.flow_runs", failed.format("ShardFailedError"))
    assert not shown("prefect.task_runs", failed.format("InvalidDatasetError"), logging.ERROR)
    assert not shown("flows.cli", "run 'x' failed", logging.ERROR, SweepFailedError("no trial completed"))
    assert not shown("flows.temporary_server", "Starting temporary server on http://127.0.0.1:8123")
    assert shown("prefect.flow_runs", failed.format("KeyError")), "our bug: its lines stay"
    assert shown("prefect.task_runs", "[rank 0] INFO epoch 1 of 1")


def a_flow():
    """A flow of two parameters, as the checks below are written against."""
    from prefect import flow

    @flow(name="two-parameters")
    def two_parameters(train_data: str | None = None, epochs: int = 5) -> None:
        pass

    return two_parameters


def test_a_check_of_a_flows_arguments_takes_them_by_name_and_type():
    from flows.cli import checks
    from tasks.errors import PipelineInputError

    @checks(a_flow())
    def check(*, epochs: int) -> None:
        if epochs > 100:
            raise PipelineInputError(f"epochs {epochs} is more than 100")

    check(epochs=5)
    with pytest.raises(PipelineInputError, match="^epochs 500 is more than 100$"):
        check(epochs=500)


def renamed(*, training_data: str | None) -> None:  # the flow's train_data, renamed there
    pass


def retyped(*, epochs: float) -> None:  # the flow's int
    pass


def positional(epochs: int) -> None:  # a call by position would outlive a rename
    pass


@pytest.mark.parametrize(
    ("check", "wrong"),
    [(renamed, "training_data: str | None"), (retyped, "epochs: float"), (positional, "epochs: int")],
)
def test_a_check_that_does_not_match_its_flows_parameters_fails_when_defined(check, wrong):
    """A flow parameter renamed or retyped and the check not following fails at import, not in a user's run."""
    from flows.cli import checks

    with pytest.raises(TypeError) as refused:
        checks(a_flow())(check)
    assert str(refused.value) == (
        f"{check.__name__} checks {wrong}: not keyword-only parameters of two-parameters, which takes "
        "train_data: str | None, epochs: int"
    )
