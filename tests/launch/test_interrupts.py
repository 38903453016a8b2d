"""One Ctrl-C (SIGINT), or one SIGTERM, stops a training run whatever the launcher's main thread is doing: StopOnSignal
alone (in this process), then the command line as a user runs it, real torchrun, the signal coming while
the main thread waits inside the per-epoch publishing (the progress artifact's update, held unanswered by a proxy
in front of the real Prefect server)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tasks.contracts.model_directory import LOGS_DIR
from tasks.launch.interrupts import StopOnSignal
from tasks.launch.torchrun_launcher import claim_output
from tests.helpers import alive, training_processes, wait_for, write_class_folders
from tests.launch.interrupting import HoldingProxy, signal_in_a_weakref_callback

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = 500  # never reached: the signal comes at the first epoch's publishing
# The launcher stops torchrun and its ranks while the main thread is still held in that publishing: they are gone
# SIGNAL_GRACE_S after the signal at most, plus what a loaded host takes to end them (CI's, three test processes on
# two cores, needed more than 15 s). Without the launcher's thread they would train all EPOCHS first (minutes).
STOPPED_WITHIN_S = 60
TINY = ("--no-pretrained", "--batch-size", "2", "--image-size", "32", "--device", "cpu")
# Ctrl-C with the 2 ranks it was lost with; SIGTERM takes the same path, with one rank for less CPU.
RANKS = {signal.SIGINT: 2, signal.SIGTERM: 1}


@pytest.fixture
def handlers():
    """SIGINT as Python sets it, both handlers put back after. A test process may start with it ignored (pytest-xdist's
    workers do), and a command it starts would inherit that: its Ctrl-C would be ignored, as in a shell's background
    job, which the launcher respects (CI's clean clone: the command's threads caught SIGTERM only)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_is_recorded_stopped_for_by_a_thread_and_raised_again_on_leaving(handlers):
    """Even where Python drops exceptions: without the launcher's handler, the KeyboardInterrupt is lost there."""
    signal_in_a_weakref_callback(signal.SIGINT)
    stopped, went_on = threading.Event(), []
    with pytest.raises(KeyboardInterrupt):
        with StopOnSignal(stopped.set) as signalled:
            signal_in_a_weakref_callback(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)  # a second signal: recorded no further
            went_on.append(signalled.received)
            assert stopped.wait(60), "the stop runs while this thread goes on"
    assert went_on == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_goes_on_to_the_handler_before_an_ignored_signal_stays_ignored_and_no_signal_stops_nothing(handlers):
    received, stops = [], []
    signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with StopOnSignal(lambda: stops.append("stopped")) as signalled:
        signal.raise_signal(signal.SIGINT)
        assert signalled.received is None and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGTERM)
        assert received == [], "held until the launcher leaves"
    assert received == [signal.SIGTERM] and stops == ["stopped"]
    with StopOnSignal(lambda: stops.append("stopped again")):
        pass
    assert stops == ["stopped"] and "stop-on-signal" not in [thread.name for thread in threading.enumerate()]


def test_off_the_main_thread_the_signals_are_left_alone(handlers):
    inside = []

    def launcher() -> None:
        with StopOnSignal(lambda: None):
            inside.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=launcher)
    thread.start()
    thread.join()
    assert inside == [signal.default_int_handler]


def start_training(folder: Path, work: Path, api_url: str, sig: int) -> tuple[subprocess.Popen, Path]:
    """``python -m flows.pipeline`` training into ``work``; its stderr goes to a file (the training's lines fill it)."""
    data = ("--train-data", str(folder / "train"), "--validation-data", str(folder / "val"))
    training = ("--epochs", str(EPOCHS), "--patience", str(EPOCHS), "--processes-per-node", str(RANKS[sig]), *TINY)
    stderr = folder / f"{signal.Signals(sig).name}.stderr"
    command = subprocess.Popen(
        [sys.executable, "-m", "flows.pipeline", *data, *training, "--work-dir", str(work)],
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("w"),
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": api_url},
    )
    return command, stderr


def runs_of_flow_run(log: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterName

    name = re.search(r"Beginning flow run '([^']+)'", log)[1]
    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]))
        )
    return flow_run, task_runs, artifacts


def threads_of(pid: int) -> str:
    """Each thread of ``pid``: its name, state, where the kernel holds it, and its pending, blocked and caught
    signals (which thread a process-directed signal went to, and whether Python's handler ran)."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
        try:
            status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line)
            wchan = (task / "wchan").read_text()
        except OSError:
            continue
        keys = ("Name", "State", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")
        lines.append(
            f"  {task.name} " + " ".join(f"{k}={status.get(k, '?').strip()}" for k in keys) + f" wchan={wchan}"
        )
    return "\n".join(lines)


def interrupt_the_publishing(proxy: HoldingProxy, folder: Path, work: Path, sig: int) -> tuple[int, str]:
    """A training started, ``sig`` sent while it waits inside the first epoch's publishing; torchrun and its ranks
    gone within STOPPED_WITHIN_S while that call is still held (the launcher's thread stopped them); then answered. The
    command's exit status and stderr."""
    name = signal.Signals(sig).name
    proxy.arm(b"PATCH /api/artifacts/")  # the progress update: the first call of each epoch's publishing
    command, stderr = start_training(folder, work, proxy.url, sig)
    try:
        wait_for(lambda: proxy.held.is_set() or command.poll() is not None, 300, what="the first publishing")
        assert proxy.held.is_set(), stderr.read_text()[-3000:]
        spawned = list(training_processes(work))
        assert len(spawned) >= 1 + RANKS[sig], spawned  # torchrun and its ranks
        command.send_signal(sig)
        wait_for(
            lambda: not any(map(alive, spawned)),
            STOPPED_WITHIN_S,
            what=lambda: f"torchrun and the ranks to stop on {name}; the command's threads:\n{threads_of(command.pid)}",
        )
        assert command.poll() is None, "the command waits inside the held publishing call"
        proxy.release()
        return command.wait(timeout=120), stderr.read_text()
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


@pytest.mark.integration  # subprocesses
def test_one_signal_during_the_publishing_stops_every_process_and_the_run_ends_crashed(
    prefect_server, tmp_path, handlers
):
    """Ctrl-C, then SIGTERM for the next run in the same work_dir (which starts cleanly), each while the main thread
    waits inside an epoch's publishing: every training process stops at once; the publishing then ends (its curves
    are published: the signal raised nothing inside it), the command exits 128 + the signal's number with one line,
    the run and its train task are Crashed (not retried), and no process holds the model folder."""
    from prefect.settings import PREFECT_API_URL

    write_class_folders(tmp_path / "train", 4)
    write_class_folders(tmp_path / "val", 2, seed=1)
    work = tmp_path / "runs"
    proxy = HoldingProxy(PREFECT_API_URL.value())
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            status, told = interrupt_the_publishing(proxy, tmp_path, work, sig)
            errors = [line for line in told.splitlines() if "error:" in line]
            assert status == 128 + sig, told[-3000:]
            assert len(errors) == 1 and errors[0].startswith("error: stopped by "), told[-3000:]
            assert signal.Signals(sig).name in errors[0], errors[0]
            assert not [line for line in told.splitlines() if line.startswith("Traceback")], told[-3000:]
            assert "Crash detected" not in told, "Prefect's crash lines: in the log only"

            log = Path(errors[0].rsplit("(full log: ", 1)[1].rstrip(")")).read_text()
            flow_run, task_runs, artifacts = runs_of_flow_run(log)
            assert flow_run.state.is_crashed(), flow_run.state
            (train,) = [t for t in task_runs if t.name.startswith("train-")]
            assert train.state.is_crashed() and train.run_count == 1, train.state
            (progress,) = [a.description for a in artifacts if a.key == "training-progress"]
            done = re.fullmatch(rf"(\d+) of {EPOCHS} epochs", progress)
            assert done, progress
            curves = [a.description for a in artifacts if a.key == "training-curves"]
            assert f"so far: {done[1]} of {EPOCHS} epochs" in curves, (progress, curves)

            model = work / f"{flow_run.name}-{str(flow_run.id)[:8]}" / "model"
            claim_output(model / LOGS_DIR, wait_seconds=0)  # what a re-run of it does first
            assert not training_processes(work)
    finally:
        proxy.close()
