"""A process's peak memory is its own program's, not its parent's (getrusage's would start at the parent's)."""

import subprocess
import sys

import pytest

from deployments.local import PROJECT_ROOT
from tasks.memory import peak_rss_mb

pytestmark = pytest.mark.integration  # subprocesses

PEAK = "from tasks.memory import peak_rss_mb; print(peak_rss_mb())"
# A parent that holds 400 MB, then becomes a fresh program (exec, as a worker started by a launcher does).
BIG_THEN_EXEC = f"""
import os, sys
held = b"x" * (400 * 2**20)  # written: resident
os.execv(sys.executable, [sys.executable, "-c", {PEAK!r}])
"""


def test_the_peak_grows_with_what_the_process_holds():
    before = peak_rss_mb()
    held = bytearray(100 * 2**20)
    held[::4096] = b"x" * len(held[::4096])  # touched: resident
    assert peak_rss_mb() >= before and peak_rss_mb() >= 100


def peak_of(code: str) -> float:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT)
    return float(done.stdout)


def test_a_program_started_by_exec_reports_its_own_peak_not_its_parents():
    alone, after_exec = peak_of(PEAK), peak_of(BIG_THEN_EXEC)
    assert alone < 200 and after_exec < 200, (alone, after_exec)
