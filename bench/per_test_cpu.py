"""The test suite's CPU-seconds test by test: clean clones of revisions, each suite run in one test process inside
a cgroup of its own.

    python -m bench.per_test_cpu f0fb65d HEAD      # two clean clones, about 28 minutes each on 2 cores

bench.suite_cpu compares whole runs of `.ci/run` as CI runs them (three test processes on two cores) by kind of
process; this one says which test. Each clone runs `make test TEST_WORKERS=0` (one test process, the files in the
same order) inside a cgroup made for it, and a pytest plugin (this module, handed to every revision's pytest from
a folder on PYTHONPATH, so an old revision needs nothing of it) reads the cgroup's CPU counter before and after
each test: everything the test caused counts to it, its servers, trainings and subprocesses included, and a session
fixture to the first test that uses it. Nothing is sampled, so nothing short-lived is missed. Linux, with a
writable cgroup (cgroup v1's cpuacct or cgroup v2; root). Writes ``bench/results/<date>-per-test-cpu.json`` and
prints each revision's totals, the files and the tests that differ most.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import pytest

# What the plugin reads and where it writes, handed to the clone's pytest through its environment.
COUNTER, RECORDS = "PER_TEST_CPU_COUNTER", "PER_TEST_CPU_RECORDS"
SHOWN = 25  # files and tests listed by the report


def cpu_seconds(counter: Path) -> float:
    """A cgroup's CPU-seconds: cgroup v1's ``cpuacct.usage`` (nanoseconds) or cgroup v2's ``cpu.stat``
    (``usage_usec``)."""
    text = counter.read_text()
    if counter.name == "cpu.stat":
        return int(dict(line.split() for line in text.splitlines())["usage_usec"]) / 1e6
    return int(text) / 1e9


def new_cgroup(name: str) -> tuple[Path, Path]:
    """A cgroup of its own: its CPU counter and the file a process joins it by."""
    v1 = Path("/sys/fs/cgroup/cpuacct")
    folder = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / name
    folder.mkdir()
    counter = folder / ("cpuacct.usage" if v1.is_dir() else "cpu.stat")
    return counter, folder / "cgroup.procs"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The plugin: one line per test, ``[node id, CPU-seconds, wall seconds]``, set-up and tear-down included."""
    counter = Path(os.environ[COUNTER])
    before, started = cpu_seconds(counter), time.monotonic()
    yield
    line = [item.nodeid, round(cpu_seconds(counter) - before, 2), round(time.monotonic() - started, 2)]
    with open(os.environ[RECORDS], "a", encoding="utf-8") as records:
        records.write(json.dumps(line) + "\n")


def measure(revision: str, scratch: Path) -> dict:
    """A clean clone at ``revision``, its ``make test TEST_WORKERS=0`` in a cgroup made for it, each test's CPU."""
    from bench.suite_cpu import clone_at  # here: the plugin alone loads in any revision's pytest

    clone, plugin, records = scratch / "clone", scratch / "plugin", scratch / f"{revision}.jsonl"
    commit = clone_at(revision, clone)
    plugin.mkdir(exist_ok=True)
    shutil.copy(__file__, plugin / "per_test_cpu.py")
    counter, procs = new_cgroup(f"per-test-cpu-{os.getpid()}-{revision}")
    started = time.monotonic()
    env = {**os.environ, COUNTER: str(counter), RECORDS: str(records), "PYTHONPATH": str(plugin)}
    join_and_test = 'echo $$ > "$1" && exec make test TEST_WORKERS=0 PYTEST_ARGS="-p per_test_cpu"'
    run = subprocess.run(["bash", "-c", join_and_test, "_", str(procs)], cwd=clone, env=env, capture_output=True)
    said = (run.stdout + run.stderr).decode(errors="replace").strip().splitlines()
    tests = [json.loads(line) for line in records.read_text().splitlines()] if records.is_file() else []
    shutil.rmtree(clone)  # its virtual environment: gigabytes
    whole = cpu_seconds(counter)  # the whole `make test`: install, lint and tests
    with contextlib.suppress(OSError):
        counter.parent.rmdir()  # empty once every process of the run has ended
    return {
        "revision": revision,
        "commit": commit,
        "returncode": run.returncode,
        "last_line": said[-1] if said else "",
        "wall_s": round(time.monotonic() - started, 1),
        "cgroup_cpu_s": round(whole, 1),
        "tests_cpu_s": round(sum(cpu for _, cpu, _ in tests), 1),
        "tests": tests,
    }


def by_file(run: dict) -> dict[str, float]:
    files: dict[str, float] = defaultdict(float)
    for nodeid, cpu, _ in run["tests"]:
        files[nodeid.split("::")[0]] += cpu
    return files


def report(base: dict, head: dict) -> str:
    """Both runs' totals, then the files and the tests whose CPU differs most (absent counts as 0)."""
    lines = [
        f"{run['revision']} ({run['commit']}): tests {run['tests_cpu_s']:,.1f} CPU-s in {len(run['tests'])} tests, "
        f"make test {run['cgroup_cpu_s']:,.0f} CPU-s, {run['wall_s']:,.0f} s  [{run['last_line']}]"
        for run in (base, head)
    ]
    difference = head["tests_cpu_s"] - base["tests_cpu_s"]
    lines.append(
        f"tests: {difference:+,.1f} CPU-s ({difference / base['tests_cpu_s']:+.1%}) {head['revision']} vs {base['revision']}"
    )
    for title, of in (("file", by_file), ("test", lambda run: {t[0]: t[1] for t in run["tests"]})):
        a, b = of(base), of(head)
        changed = sorted(set(a) | set(b), key=lambda key: -abs(b.get(key, 0) - a.get(key, 0)))[:SHOWN]
        lines.append(f"{'difference':>10s}  {base['revision'][:10]:>10s}  {head['revision'][:10]:>10s}  {title}")
        lines += [f"{b.get(k, 0) - a.get(k, 0):+10.1f}  {a.get(k, 0):10.1f}  {b.get(k, 0):10.1f}  {k}" for k in changed]
    return "\n".join(lines)


def dumps(record: dict) -> str:
    """The record as JSON, each test's ``[node id, CPU-seconds, wall seconds]`` on a line of its own."""
    text = json.dumps(record, indent=1)
    return re.sub(r'\[\n\s+("(?:[^"\\]|\\.)*"),\n\s+([-\d.e]+),\n\s+([-\d.e]+)\n\s+\]', r"[\1, \2, \3]", text) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the revision compared against, e.g. f0fb65d")
    parser.add_argument("head", help="the revision measured, e.g. HEAD")
    parser.add_argument("--output", type=Path, help="default: bench/results/<date>-per-test-cpu.json")
    args = parser.parse_args(argv)
    from bench.suite_cpu import RESULTS, is_revision  # here: the plugin alone loads in any revision's pytest

    unknown = [rev for rev in (args.base, args.head) if not is_revision(rev)]
    if unknown:
        print(f"not a revision of this repository: {', '.join(unknown)}", file=sys.stderr)
        return 2
    try:
        counter, _ = new_cgroup(f"per-test-cpu-check-{os.getpid()}")
        counter.parent.rmdir()
    except OSError as error:
        print(f"bench.per_test_cpu needs a cgroup of its own (Linux, root): {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="per-test-cpu-") as scratch:
        base, head = (measure(revision, Path(scratch)) for revision in (args.base, args.head))
    print(report(base, head))
    out = args.output or RESULTS / f"{datetime.now(timezone.utc):%Y-%m-%d}-per-test-cpu.json"
    out.write_text(dumps({"command": "make test TEST_WORKERS=0", "runs": [base, head]}))
    print(f"written {out}")
    return 0 if base["returncode"] == head["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
