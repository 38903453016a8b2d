"""Training processes never outlive their run, and a silent or stuck rank ends in a clear error: real torchrun."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tasks.contracts.model_directory import LOGS_DIR
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import (
    InvalidDatasetError,
    InvalidModelDirectoryError,
    OutputInUseError,
    TrainingFailedError,
    TrainingHungError,
    TrainingTimeoutError,
)
from tasks.launch.torchrun_launcher import WatchLimits, build_torchrun_command, launch_training, worker_environment
from tasks.training.lifeline import HangWatch, TrainingHang, read_heartbeats
from tests.helpers import alive, processes_of, wait_for, write_class_folders

pytestmark = pytest.mark.integration

# Long enough that every test below interrupts it; none of them runs it to the end.
LONG = dict(epochs=200, patience=200, batch_size=4, processes_per_node=2, device="cpu")


def while_training(outcome: dict, condition):
    """``condition`` for ``wait_for``, which stops at once with the outcome once the training (in a thread) ended."""

    def check():
        if value := condition():
            return value
        assert not outcome, f"training ended while waiting: {outcome}"

    return check


def training_heartbeats(output: Path, ranks: int = 2) -> dict[int, dict]:
    beats = read_heartbeats(output / LOGS_DIR)
    return beats if len(beats) == ranks and all(b["phase"] == "train" for b in beats.values()) else {}


def launch_in_thread(data, spec, output, params):
    outcome = {}

    def target():
        try:
            outcome["result"] = launch_training(
                TrainingFolders(*data, spec, output), params, log=lambda level, line: None, poll_seconds=0.2
            )
        except Exception as error:  # inspected by the test
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_workers_die_with_the_flow_process_killed_by_sigkill(tmp_path, colour_image_dirs, resnet_spec):
    output = tmp_path / "model"
    train, val = colour_image_dirs
    script = textwrap.dedent(f"""
        from tasks.launch.torchrun_launcher import launch_training
        from tasks.contracts.training_config import TrainingFolders, TrainingParams
        folders = TrainingFolders({str(train)!r}, {str(val)!r}, {str(resnet_spec)!r}, {str(output)!r})
        launch_training(folders, TrainingParams(**{LONG!r}))
    """)
    flow_process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env=worker_environment(TrainingParams()),
    )
    try:
        beats = wait_for(lambda: training_heartbeats(output), what="both ranks training")
        spawned = processes_of(output)
        assert {b["pid"] for b in beats.values()} <= set(spawned) and len(spawned) >= 3  # torchrun + 2 workers
        flow_process.kill()
        wait_for(lambda: not any(alive(pid) for pid in spawned), timeout=30, what="torchrun and workers to exit")
    finally:
        flow_process.kill()
        flow_process.wait()
        for pid in processes_of(output):
            os.kill(pid, signal.SIGKILL)


def test_workers_die_when_torchrun_process_group_is_killed(tmp_path, colour_image_dirs, resnet_spec):
    output = tmp_path / "model"
    thread, outcome = launch_in_thread(colour_image_dirs, resnet_spec, output, TrainingParams(**LONG))
    beats = wait_for(while_training(outcome, lambda: training_heartbeats(output)), what="both ranks training")
    workers = [b["pid"] for b in beats.values()]
    torchrun = next(pid for pid in processes_of(output) if pid not in workers and os.getpgid(pid) == pid)
    os.killpg(torchrun, signal.SIGKILL)
    thread.join(timeout=60)
    assert isinstance(outcome.get("error"), TrainingFailedError)
    wait_for(lambda: not any(alive(pid) for pid in workers), timeout=30, what="the workers to exit")


def test_a_new_attempt_never_trains_beside_an_earlier_attempts_workers(tmp_path, colour_image_dirs, resnet_spec):
    output = tmp_path / "model"
    train, val = colour_image_dirs
    # An earlier attempt's worker, still running (a plain start is a world of one).
    folders = TrainingFolders(train, val, resnet_spec, output)
    command = build_torchrun_command(folders, TrainingParams(**{**LONG, "processes_per_node": 1}))
    worker_argv = command[command.index("-m", 2) :]
    earlier = subprocess.Popen(
        [sys.executable, *worker_argv],
        env=worker_environment(TrainingParams()),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: training_heartbeats(output, ranks=1), what="the earlier worker to train")
        params = TrainingParams(epochs=1, batch_size=4, device="cpu")
        with pytest.raises(OutputInUseError, match=f"pid {earlier.pid}"):
            launch_training(
                TrainingFolders(train, val, resnet_spec, output),
                params,
                log=lambda level, line: None,
                limits=WatchLimits(output_lock_wait_s=2),
            )
        assert earlier.poll() is None, "the new attempt must not touch the earlier one's processes"
    finally:
        earlier.kill()
        earlier.wait()
    # Once it is gone, the folder is free again and the retry resumes from its checkpoint.
    model_dir = launch_training(TrainingFolders(train, val, resnet_spec, output), params, log=lambda level, line: None)
    assert model_dir.metrics().epochs


def test_a_stopped_rank_is_named_and_every_process_stopped(tmp_path, colour_image_dirs, resnet_spec):
    output = tmp_path / "model"
    params = TrainingParams(**LONG, hang_timeout_s=6)
    thread, outcome = launch_in_thread(colour_image_dirs, resnet_spec, output, params)
    beats = wait_for(while_training(outcome, lambda: training_heartbeats(output)), what="both ranks training")
    spawned = processes_of(output)
    os.kill(beats[1]["pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    thread.join(timeout=120)
    error = outcome.get("error")
    assert isinstance(error, TrainingHungError), outcome
    assert time.monotonic() - stopped_at < 60
    assert error.rank == 1
    assert str(error).startswith(f"training hung: rank 1 (pid {beats[1]['pid']}")
    assert "no heartbeat" in str(error) and "every training process was stopped" in str(error)
    wait_for(lambda: not any(alive(pid) for pid in spawned), timeout=30, what="every process to exit")


def test_training_past_its_time_limit_is_stopped(tmp_path, colour_image_dirs, resnet_spec):
    output = tmp_path / "model"
    params = TrainingParams(**{**LONG, "processes_per_node": 1}, timeout_minutes=0.25)
    started = time.monotonic()
    with pytest.raises(TrainingTimeoutError, match="past its limit of 0.25 minutes"):
        launch_training(TrainingFolders(*colour_image_dirs, resnet_spec, output), params, log=lambda level, line: None)
    assert time.monotonic() - started < 60
    assert not processes_of(output)


def test_hang_watch_tells_a_silent_rank_from_a_stuck_world():
    watch = HangWatch(silent_seconds=10, stall_seconds=30)

    def beat(rank, n, step, phase="train"):
        return {"rank": rank, "pid": 100 + rank, "host": "h", "beat": n, "phase": phase, "epoch": 0, "step": step}

    watch.check({0: beat(0, 1, 1), 1: beat(1, 1, 1)}, now=0)
    watch.check({0: beat(0, 5, 4), 1: beat(1, 2, 3)}, now=8)
    # Rank 1 stops beating at t=8; rank 0 keeps beating but waits for it.
    with pytest.raises(TrainingHang) as silent:
        watch.check({0: beat(0, 9, 4), 1: beat(1, 2, 3)}, now=19)
    assert silent.value.ranks == [1] and "rank 1 (pid 101" in str(silent.value)

    stuck = HangWatch(silent_seconds=10, stall_seconds=30)
    stuck.check({0: beat(0, 1, 7), 1: beat(1, 1, 6)}, now=0)
    stuck.check({0: beat(0, 2, 8), 1: beat(1, 2, 6)}, now=5)
    stuck.check({0: beat(0, 9, 8), 1: beat(1, 9, 6)}, now=34)  # both beat, neither moves on
    with pytest.raises(TrainingHang) as stalled:
        stuck.check({0: beat(0, 10, 8), 1: beat(1, 10, 6)}, now=36)
    assert stalled.value.ranks == [1] and "no progress for" in str(stalled.value)

    finished = HangWatch(silent_seconds=10, stall_seconds=30)
    finished.ignore({3: beat(3, 7, 2)})  # an earlier attempt's heartbeat, never rewritten
    finished.check({0: beat(0, 1, 1, "done"), 3: beat(3, 7, 2)}, now=0)
    finished.check({0: beat(0, 1, 1, "done"), 3: beat(3, 7, 2)}, now=100)


@pytest.mark.parametrize("broken", ["train", "model_spec"])
def test_input_errors_inside_the_worker_keep_their_type(tmp_path, colour_image_dirs, resnet_spec, broken):
    train, val = colour_image_dirs
    not_an_image_directory = write_class_folders(tmp_path / "raw", per_class=2)
    empty = tmp_path / "empty-spec"
    empty.mkdir()
    data = (not_an_image_directory, val) if broken == "train" else (train, val)
    spec = empty if broken == "model_spec" else resnet_spec
    expected = InvalidDatasetError if broken == "train" else InvalidModelDirectoryError
    params = TrainingParams(epochs=1, processes_per_node=1, device="cpu")
    with pytest.raises(expected) as error:
        launch_training(TrainingFolders(*data, spec, tmp_path / "model"), params, log=lambda level, line: None)
    assert not isinstance(error.value, TrainingFailedError)
    assert "raised by training rank" in str(error.value) and "driver_log_" in str(error.value)


def test_a_last_batch_of_one_image_trains_and_the_launch_leaves_nothing_in_the_temporary_folder(
    tmp_path, resnet_spec, monkeypatch
):
    import tempfile

    from tasks.convert.conversion import convert_to_image_directory

    train = convert_to_image_directory(write_class_folders(tmp_path / "src-train", 11, seed=3), tmp_path / "train").root
    val = convert_to_image_directory(write_class_folders(tmp_path / "src-val", 2, seed=4), tmp_path / "val").root
    # The system's temporary folder, this launch's alone: torchrun left a torchelastic_* folder there every launch.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", None)
    # 33 images in batches of 16 on one process: 16 + 16 + 1; the images are 16 px, trained at 32 px (1x1 at the end).
    params = TrainingParams(epochs=1, batch_size=16, processes_per_node=1, device="cpu", image_size=32)
    model_dir = launch_training(
        TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
    )
    assert [e.epoch for e in model_dir.metrics().epochs] == [1]
    # torch's compile cache (torchinductor_<user>) is one folder per user, kept and reused by every run on purpose.
    assert [p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_")] == []


def test_the_train_task_does_not_retry_an_input_error_raised_in_the_worker(prefect_server, tmp_path, colour_image_dirs):
    from prefect import flow

    from tasks.launch.prefect_tasks import train as train_task

    _, val = colour_image_dirs
    empty_spec = tmp_path / "spec"
    empty_spec.mkdir()

    @flow
    def train_once():
        return train_task(
            TrainingFolders(colour_image_dirs[0], val, empty_spec, tmp_path / "model"),
            TrainingParams(epochs=1, device="cpu"),
            return_state=True,
        )

    state = train_once(return_state=True).result(raise_on_failure=False)
    assert state.is_failed() and "model_spec.json" in state.message
    with pytest.raises(InvalidModelDirectoryError):
        state.result()
    assert state.state_details.task_run_id is not None
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        assert client.read_task_run(state.state_details.task_run_id).run_count == 1
