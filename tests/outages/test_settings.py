"""The settings that let a run ride out a server restart reach the processes it starts; a user's own value wins."""

import os
import subprocess
import sys

import pytest

from tasks.outages.settings import RIDE_OUT_SERVER_RESTART, heartbeat_tag, ride_out_in_this_environment


@pytest.mark.integration  # a subprocess
def test_the_processes_a_worker_starts_inherit_the_retries_and_a_users_value_wins(monkeypatch):
    (setting,) = RIDE_OUT_SERVER_RESTART
    monkeypatch.setenv(setting, "")  # restored after the test, whatever this process had
    monkeypatch.delenv(setting)
    ride_out_in_this_environment()
    child = [sys.executable, "-c", f"import os; print(os.environ[{setting!r}])"]
    assert subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip() == "7"
    monkeypatch.setenv(setting, "2")
    ride_out_in_this_environment()
    assert os.environ[setting] == "2"


def test_the_tag_names_the_pace_a_run_beats_at():
    assert heartbeat_tag(60) == "beats-every-60s" != heartbeat_tag(30)
