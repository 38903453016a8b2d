import subprocess
import sys

from deployments.local import PROJECT_ROOT
from tasks.allocator import ENVIRONMENT, allocator_environment

PROBE = "from tasks.allocator import keep_freed_memory; print(keep_freed_memory(), keep_freed_memory())"


def run_probe(**extra_env: str) -> str:
    env = {"PATH": "/usr/bin:/bin", **extra_env}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env, cwd=PROJECT_ROOT
    )
    return result.stdout.strip()


def test_a_running_process_takes_the_settings_once():
    # This project's machines run glibc; elsewhere the call is a no-op that says False.
    assert run_probe() == "True True"


def test_settings_the_user_chose_are_left_alone():
    assert run_probe(MALLOC_MMAP_THRESHOLD_="131072") == "False False"
    assert run_probe(GLIBC_TUNABLES="glibc.malloc.trim_threshold=0") == "False False"


def test_subprocess_environment_gets_both_thresholds_or_neither():
    assert allocator_environment({"A": "1"}) == {"A": "1", **ENVIRONMENT}
    assert allocator_environment({"MALLOC_TRIM_THRESHOLD_": "0"}) == {"MALLOC_TRIM_THRESHOLD_": "0"}


def test_peak_memory_is_the_process_own_not_its_parents():
    # getrusage's ru_maxrss would report the parent's 400 MB here: it survives fork and exec.
    ballast = bytearray(400 * 2**20)
    ballast[:: 2**12] = b"x" * len(ballast[:: 2**12])  # touch every page: resident, not just reserved
    probe = "from tasks.memory import peak_rss_mb; print(peak_rss_mb())"
    child = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=PROJECT_ROOT)
    assert 1 < float(child.stdout) < 200
    del ballast
