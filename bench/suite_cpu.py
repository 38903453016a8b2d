"""The test suite's CPU-seconds, revision against revision, process by process.

    python -m bench.suite_cpu f0fb65d HEAD --rounds 2      # four clean clones' `.ci/run`: a, b, a, b

Each run is a fresh ``git clone`` of this repository checked out at the revision, its ``.ci/run`` (the virtual
environment, the packages, lint and ``make test``) started in a session of its own, and every process descended
from it sampled from ``/proc`` twice a second: its CPU-seconds (user + system) when last seen, and what kind of
process it is (a training worker, a torchrun agent, a Prefect server, ...). A process keeps the parent it had when
first seen, so servers that outlive their test process still count. Processes that start and end between two
samples are missed (a few percent; the machine's ``/proc/stat`` busy time over the run is printed beside it as a
check, meaningful only on an otherwise idle machine).

Why not compare single runs: on the 2-core VM the same revision's suite measured 1,431-1,743 CPU-s, a spread of up
to 20%, while a change worth making moves it 2-3%. The runs alternate (a, b, a, b) so that both revisions see the
same hours of the machine, and the kinds of process show where a difference lies: the same ``pip install`` costs
more in a slow hour, a new test's training launches do not. Linux only; takes about 18 minutes a run on 2 cores
(not in ``make bench``). Writes ``bench/results/<date>-suite-cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Container
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from bench.harness import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "bench" / "results"
TICKS = os.sysconf("SC_CLK_TCK")
# The kind of a process, by its command line: the first pattern that matches names it.
KINDS: tuple[tuple[str, str], ...] = (
    ("torchrun agent", r"-m torch\.distributed\.run"),  # before the worker: its command line names the worker
    ("training worker", r"-m tasks\.training\.worker"),
    ("pytest-xdist process", r"exec\(eval\(sys\.stdin"),
    ("pytest", r"-m pytest"),
    ("Prefect server", r"prefect server start|uvicorn .*prefect\.server"),
    ("Prefect database migration", r"prefect server database upgrade"),
    ("Prefect worker", r"prefect worker start|-m deployments\.worker"),
    ("flow-run process", r"-m (deployments\.engine|prefect\.engine)|_workspace_supervisor"),
    ("`make deploy`", r"-m deployments\.deploy|prefect .*deploy --all"),
    ("moto S3 endpoint", r"-m tests\.s3_server"),
    ("PostgreSQL", r"^postgres|/postgres |deployments\.postgres"),
    ("Chromium", r"chrom"),
    ("pip", r"-m pip\b|/pip\b"),
    ("ruff", r"ruff"),
    ("pipeline command line", r"-m flows\.pipeline|image-classifier train"),
    ("scoring command line", r"-m flows\.score|image-classifier score"),
    ("sweep command line", r"-m flows\.sweep"),
    ("endpoint", r"-m tasks\.serving|image-classifier serve"),
    ("benchmark", r"-m bench\."),
    ("compiler (torch.compile)", r"^cc1plus|/cc1plus|^g\+\+|^gcc"),
)


HEAVIEST = 8  # the processes of each kind kept in the record with their CPU and command line (what a kind holds)


def kind_of(command: str) -> str:
    """The kind of a process from its command line (its name where it has none); "other" when no pattern fits."""
    for kind, pattern in KINDS:
        if re.search(pattern, command):
            return kind
    return "other"


@dataclass
class Seen:
    parent: int
    command: str
    cpu: float  # its CPU-seconds when last seen (all of them: a descendant started after the sampler)


def read_processes(known: Container[tuple[int, int]] = ()) -> dict[tuple[int, int], tuple[int, str | None, float]]:
    """Every process now: (pid, start time) -> (parent pid, command line or name, CPU-seconds); the command is read
    only for a process not in ``known`` (None for those: a process keeps the command it was first seen with)."""
    now = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
            name_end = text.rfind(")")
            fields = text[name_end + 2 :].split()
            key, command = (int(entry), int(fields[19])), None
            if key not in known:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
                command = command or text[text.find("(") + 1 : name_end]
        except OSError:  # ended while read
            continue
        now[key] = (int(fields[1]), command, (int(fields[11]) + int(fields[12])) / TICKS)
    return now


def busy_seconds() -> float:
    """The machine's busy CPU-seconds since boot (/proc/stat: every state but idle and iowait)."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICKS


@dataclass
class Sampler:
    """Samples /proc every ``interval`` seconds in a thread; ``descendants(pid)`` are the processes seen under pid."""

    interval: float = 0.5
    seen: dict[tuple[int, int], Seen] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        for key, (parent, command, cpu) in read_processes(self.seen).items():
            if command is None:
                self.seen[key].cpu = cpu
            else:
                self.seen[key] = Seen(parent, command, cpu)

    def __enter__(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def descendants(self, root: int) -> list[Seen]:
        children = defaultdict(list)
        for (pid, _), seen in self.seen.items():
            children[seen.parent].append((pid, seen))
        found, todo = [], [root]
        while todo:
            for pid, seen in children.pop(todo.pop(), []):
                found.append(seen)
                todo.append(pid)
        return found


def clone_at(revision: str, clone: Path) -> str:
    """A fresh clone of this repository in ``clone``, checked out at ``revision``: its short commit."""
    subprocess.run(["git", "clone", "--quiet", str(PROJECT_ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", revision], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return commit.stdout.strip()


def failures(said: list[str], most: int = 400) -> list[str]:
    """pytest's report of its failed tests in an output (from its FAILURES or ERRORS heading to the short summary),
    its last ``most`` lines: the tail alone names a failed test, not why it failed."""
    heading = next((i for i, line in enumerate(said) if re.fullmatch(r"=+ (FAILURES|ERRORS) =+", line)), None)
    if heading is None:
        return []
    end = next((i for i in range(heading, len(said)) if "short test summary info" in said[i]), len(said))
    return said[heading:end][-most:]


def measure(revision: str, command: str, scratch: Path) -> dict:
    """One clean clone of this repository at ``revision`` running ``command``: its outcome and CPU by kind."""
    clone, log = scratch / "clone", scratch / "run.log"
    commit = clone_at(revision, clone)
    busy, started = busy_seconds(), time.monotonic()
    with Sampler() as sampler, open(log, "wb") as output:
        run = subprocess.Popen(
            ["bash", "-c", command], cwd=clone, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = run.wait()
        except KeyboardInterrupt:
            os.killpg(run.pid, signal.SIGTERM)
            raise
    wall, busy = time.monotonic() - started, busy_seconds() - busy
    by_kind: dict[str, list[tuple[float, str]]] = defaultdict(list)  # kind -> (CPU-seconds, command) of each process
    for seen in sampler.descendants(run.pid):
        by_kind[kind_of(seen.command)].append((seen.cpu, seen.command.replace(str(clone), ".")[:200]))
    said = log.read_text(errors="replace").strip().splitlines()
    shutil.rmtree(clone)  # its virtual environment: gigabytes
    return {
        "revision": revision,
        "commit": commit,
        "returncode": returncode,
        "last_line": said[-1] if said else "",
        "output_tail": said[-30:],
        "failures": failures(said),
        "wall_s": round(wall, 1),
        "machine_busy_cpu_s": round(busy, 1),
        "cpu_s": round(sum(cpu for seen in by_kind.values() for cpu, _ in seen), 1),
        "kinds": {
            kind: {
                "processes": len(seen),
                "cpu_s": round(sum(cpu for cpu, _ in seen), 1),
                "heaviest": [(round(cpu, 1), command) for cpu, command in sorted(seen, reverse=True)[:HEAVIEST]],
            }
            for kind, seen in by_kind.items()
        },
    }


def report(runs: list[dict]) -> str:
    """Per revision: each run's CPU-seconds and their median; then the median CPU of each kind, side by side."""
    revisions = list(dict.fromkeys(run["revision"] for run in runs))
    of = {rev: [run for run in runs if run["revision"] == rev] for rev in revisions}
    lines = []
    for rev in revisions:
        figures = " / ".join(f"{run['cpu_s']:,.0f}" for run in of[rev])
        outcome = "; ".join(sorted({run["last_line"] for run in of[rev]}))
        median = statistics.median(run["cpu_s"] for run in of[rev])
        lines.append(f"{rev} ({of[rev][0]['commit']}): {figures} CPU-s, median {median:,.0f}  [{outcome}]")
    kinds = sorted(
        {kind for run in runs for kind in run["kinds"]},
        key=lambda kind: -max(run["kinds"].get(kind, {}).get("cpu_s", 0) for run in runs),
    )
    width = max(len(kind) for kind in kinds) if kinds else 4
    lines.append(f"{'kind':{width}s}" + "".join(f"  {rev[:12]:>12s}" for rev in revisions))
    for kind in kinds:
        cells = [
            statistics.median(run["kinds"].get(kind, {}).get("cpu_s", 0.0) for run in of[rev]) for rev in revisions
        ]
        lines.append(f"{kind:{width}s}" + "".join(f"  {cell:12.1f}" for cell in cells))
    return "\n".join(lines)


def is_revision(revision: str) -> bool:
    verify = ["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"]
    return subprocess.run(verify, cwd=PROJECT_ROOT, capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="+", help="git revisions of this repository, e.g. f0fb65d HEAD")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each revision, alternating")
    parser.add_argument("--command", default=".ci/run", help="what runs in each clone (default: .ci/run)")
    parser.add_argument("--output", type=Path, help="default: bench/results/<date>-suite-cpu.json")
    args = parser.parse_args(argv)
    if not Path("/proc/stat").is_file():
        print("bench.suite_cpu reads /proc: it runs on Linux only", file=sys.stderr)
        return 2
    unknown = [rev for rev in args.revisions if not is_revision(rev)]
    if unknown:
        print(f"not a revision of {PROJECT_ROOT}: {', '.join(unknown)}", file=sys.stderr)
        return 2
    runs = []
    with tempfile.TemporaryDirectory(prefix="suite-cpu-") as scratch:
        for round_ in range(args.rounds):
            for revision in args.revisions:
                run = measure(revision, args.command, Path(scratch))
                runs.append(run)
                print(
                    f"round {round_ + 1}, {revision}: {run['cpu_s']:,.0f} CPU-s sampled, machine busy "
                    f"{run['machine_busy_cpu_s']:,.0f}, {run['wall_s']:.0f} s, exit {run['returncode']}",
                    flush=True,
                )
    print(report(runs))
    out = args.output or RESULTS / f"{datetime.now(timezone.utc):%Y-%m-%d}-suite-cpu.json"
    out.write_text(json.dumps({"command": args.command, "runs": runs}, indent=1) + "\n")
    print(f"written {out}")
    return 0 if all(run["returncode"] == 0 for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
