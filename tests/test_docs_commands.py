"""Every shell block of README.md and docs/*.md runs as pasted, or is listed here as skipped with the reason.

A block is a fenced ```bash code block; it is known by its commands (comments left out), so rewording a comment
changes nothing while a new or changed command fails ``test_every_shell_block_is_run_or_skipped_with_a_reason``
until it is put in RUN (with what its output must say) or SKIP (with why it cannot run here).

The blocks in RUN run the way a new user runs them: in a copy of the checkout (what git would commit) with its own
``.venv``, after ``make run RUN_ARGS="--epochs 1"`` (one epoch on one process instead of five on two: the same folders,
registry and model name, in 30 s), with no
``PYTHONPATH``, no ``PREFECT_API_URL``, no virtual environment on the PATH and a HOME of their own; each page's
blocks in the order a reader meets them, in ``bash -e -o pipefail``, on a fresh copy of that state per page.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
# A line that is a command: outside a ```bash block it would escape this test.
COMMAND_LINE = re.compile(
    r"^\s*(\. \.venv/bin/activate|\.venv/bin/|make |python3? -m |prefect |image-classifier |pip )"
)


class Expect(NamedTuple):
    """What a block that ran must have said (regular expressions, searched in its stdout and stderr) and left
    behind (paths relative to the checkout)."""

    output: tuple[str, ...] = ()
    exists: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()


RUN: dict[str, Expect] = {
    # README.md
    """. .venv/bin/activate
image-classifier --help
image-classifier registry list digits-resnet18""": Expect(
        output=(r"usage: image-classifier", r"\n +train +", r"\n +score +", r"\n +registry +", r"\ndigits-resnet18/1\t")
    ),
    """make data
. .venv/bin/activate
image-classifier train --train-data data/digits/train --validation-fraction 0.2 --no-pretrained \\
    --epochs 1 --transformations '{"random_rotation": true}'""": Expect(
        output=(r"Registered digits-resnet18 version 2 in ", r"\(best epoch 1 of 1\)"),
        exists=("data/digits/train/7", "data/digits/validation/7", "registry/digits-resnet18/2/model.pt"),
    ),
    """. .venv/bin/activate
image-classifier predict data/digits/validation/3/digit_0060.png data/digits/validation/3/digit_0190.png digits-resnet18""": Expect(
        output=(r"data/digits/validation/3/digit_0060\.png: \d  \(\d 0\.\d{3}, \d 0\.\d{3}, \d 0\.\d{3}\)\n",),
    ),
    """. .venv/bin/activate
image-classifier predict data/digits/validation/3/digit_0060.png digits-resnet18 --precision int8 --calibration data/digits/validation""": Expect(
        output=(r"data/digits/validation/3/digit_0060\.png: \d  \(\d 0\.\d{3}, \d 0\.\d{3}, \d 0\.\d{3}\)\n",),
        exists=("registry/digits-resnet18/2/model.int8.onnx",),
    ),
    # docs/monitoring.md
    """. .venv/bin/activate
image-classifier monitor --help
image-classifier label-queue --help""": Expect(
        output=(r"usage: image-classifier monitor .*--records RECORDS", r"usage: image-classifier label-queue ")
    ),
    # docs/development.md
    """make lint
make data
make clean""": Expect(output=(r"All checks passed!",), absent=("runs", "registry", "data")),
    # docs/registry.md
    """. .venv/bin/activate
image-classifier registry list
image-classifier registry list digits-resnet18
image-classifier registry alias set digits-resnet18 production 1
image-classifier registry show digits-resnet18@production | head -n 5
image-classifier registry alias set digits-resnet18 staging 1
image-classifier registry alias unset digits-resnet18 staging
image-classifier registry tag digits-resnet18/1 team=vision reviewed=yes
image-classifier registry untag digits-resnet18/1 reviewed
image-classifier registry search --tag team=vision --where "accuracy>=0.9" --where "log_loss<0.5"
image-classifier registry archive digits-resnet18/1
image-classifier registry unarchive digits-resnet18/1
image-classifier registry fetch digits-resnet18@production models/digits
image-classifier registry --json list digits-resnet18""": Expect(
        output=(
            r"^digits-resnet18$",
            r"digits-resnet18@production -> version 1 \(was version 1\)\n",  # make run promoted it already
            r'"name": "digits-resnet18"',
            r"digits-resnet18@staging unset \(was version 1\)",
            r"model card of digits-resnet18 not updated: no Prefect API configured",
            # search's row (the version found by its tag and figures) between untag's note and archive's row
            r"\(set PREFECT_API_URL\)\ndigits-resnet18/1\t[^\n]*accuracy 0\.9[^\n]*\t@production team=vision\n"
            r"digits-resnet18/1\t[^\n]*\t@production team=vision  \(archived\)\n",
            r"digits-resnet18/1 -> \S+/models/digits \(files checked\)",
            r'"aliases": \[\n\s*"production"\n\s*\]',
        ),
        exists=("models/digits/model.pt", "models/digits/registration.json"),
    ),
    """make data
. .venv/bin/activate
image-classifier score data/digits/validation digits-resnet18 --output runs/scores.csv""": Expect(
        output=(r"360 images scored -> runs/scores.csv", r"accuracy 0\.9\d+, F1 \(macro\) 0\.9\d+"),
        exists=("runs/scores.csv",),
    ),
    # docs/operations.md
    """. .venv/bin/activate
image-classifier runs list
image-classifier runs prune --keep-last 5 --dry-run
image-classifier runs prune --keep-last 5
image-classifier runs prune --since 2026-11-01""": Expect(
        output=(
            r"UTC +\d+\.\d MB  runs/\S+-[0-9a-f]{8}\n1 runs, \d+\.\d MB\n",
            r"would remove 0 runs, 0\.0 MB to free; 1 kept\n",
            r"\nremoved 0 runs, 0\.0 MB freed; 1 kept\nremoved 0 runs, 0\.0 MB freed; 1 kept\n",
        ),
    ),
}

# Blocks that keep running (a server): started as pasted in the background, in a session of their own, and taken as
# done when the URL answers 200; the blocks after them run against it, and the page's end stops it (SIGTERM to the
# server it runs: it must drain and exit 0, and so must the block).
BACKGROUND: dict[str, str] = {
    # README.md
    "make serve-model MODEL=digits-resnet18@production": "http://127.0.0.1:8080/readyz",
}
RUN.update(
    {
        # README.md: against the endpoint the block before started
        """curl -H 'Content-Type: image/png' --data-binary @data/digits/validation/3/digit_0060.png http://127.0.0.1:8080/v1/predict""": Expect(
            output=(
                r'^\{"model":\{"name":"digits-resnet18","version":1,"precision":"fp32"\},"predictions":\[\{"image":"body","label":"\d",',
            )
        ),
    }
)

SERVER = "needs a running Prefect server (make server) with the deployments and a worker: tests/deployments/ run them"
SKIP: dict[str, str] = {
    # README.md
    """make run
make test""": "make run is how the state every block starts from is made (with --epochs 1); make test is the suite",
    """. .venv/bin/activate
image-classifier train --train-data photos --validation-fraction 0.2 \\
    --transformations '{"random_horizontal_flip": true}' --epochs 10""": "your own photos/, and ImageNet weights "
    "from the internet; the digits block after it runs the same command line offline",
    """make server
make deploy
make worker""": "long-running: the server and the worker keep running; tests/deployments/ start them",
    """. .venv/bin/activate
export PREFECT_API_URL=http://127.0.0.1:4200/api
prefect deployment run train-pipeline/retrain-digits --param training='{"epochs": 10}' --watch""": SERVER,
    """. .venv/bin/activate
export PREFECT_API_URL=http://127.0.0.1:4200/api
image-classifier sweep --train-data photos --validation-fraction 0.2 --epochs 6 --trials 16 --parallel 2 \\
    --search-space '{"learning_rate": {"kind": "log_uniform", "low": 0.001, "high": 0.1},
                     "batch_size": {"kind": "choice", "values": [16, 32, 64]}}'""": "your own photos/, a server with "
    "the deployments and gpu workers, and ImageNet weights; tests/flows/test_sweep.py runs sweeps through such a stack",
    # docs/scoring.md
    """image-classifier score s3://bucket/incoming/ digits-resnet18@production --shards 8 \\
    --work-dir s3://bucket/runs --registry s3://bucket/registry --output s3://bucket/scores.csv --max-failed-images 50""": "a "
    "bucket, a server with the deployments and gpu workers; tests/flows/test_score_shards.py scores in shards through "
    "such a stack",
    # docs/serving.md
    """make data
make serve-model MODEL=digits-resnet18@production""": "README.md's Serving runs the same two commands (make data in "
    "its earlier block) and a curl line against them",
    """curl -H 'Content-Type: image/png' --data-binary @data/digits/validation/3/digit_0060.png 'http://127.0.0.1:8080/v1/predict?top_k=3'""": "README.md's "
    "Serving runs this request (top_k=3 is the default it leaves out) against the endpoint make serve-model starts",
    """. .venv/bin/activate
image-classifier serve digits-resnet18@production --canary digits-resnet18/7 --canary-percent 10""": "long-running, "
    "and a seventh version; tests/serving/test_endpoint.py serves a canary beside the primary",
    """. .venv/bin/activate
image-classifier serve digits-resnet18@production --host 0.0.0.0 --ssl-certfile cert.pem --ssl-keyfile key.pem""": "long-"
    "running, and a certificate of your own; tests/serving/test_endpoint.py serves HTTPS off loopback with one",
    # README.md
    """. .venv/bin/activate
image-classifier serve digits-resnet18@production --record records --record-images low-confidence
image-classifier monitor digits-resnet18@production --records records --since 1h
image-classifier label-queue digits-resnet18 --records records --out to-label --count 200""": "long-running (the "
    "endpoint keeps answering) and an hour's records; tests/monitoring/ monitor and queue real records of real answers",
    # docs/development.md
    """make test-fast
make test PYTEST_ARGS="-k convert -x"
make bench""": "the test suite and the benchmarks themselves (minutes; this test is part of the suite)",
    "python -m bench.suite_cpu f0fb65d HEAD --rounds 2": "four clean clones' `.ci/run`, about 70 minutes; "
    "tests/bench/test_bench.py runs it on a command of seconds",
    "python -m bench.per_test_cpu f0fb65d HEAD": "two clean clones' suites in one test process each, about an hour; "
    "tests/bench/test_bench.py runs its plugin on a pytest run of two tests",
    # docs/multinode.md
    """. .venv/bin/activate
export PREFECT_API_URL=http://prefect.example.org:4200/api
pip install prefect-kubernetes
prefect work-pool create gpu-kubernetes --type kubernetes \\
    --base-job-template deployments/kubernetes-gpu-job-template.json
prefect worker start --pool gpu-kubernetes""": "needs a Kubernetes cluster and the internet; the job template "
    "is checked in tests/flows/test_pipeline_nodes.py",
    # docs/operations.md
    """make server
make deploy
make worker
make serve""": "long-running: the server, the worker and serve keep running; tests/deployments/ start them",
    """. .venv/bin/activate
export PREFECT_API_URL=http://127.0.0.1:4200/api
python -m deployments.auth client -- \\
    prefect deployment run train-pipeline/retrain-digits --param training='{"epochs": 10}' --watch""": SERVER,
    """ssh gpu-0 'umask 077 && mkdir -p ~/.config/image-classifier && cat > ~/.config/image-classifier/prefect-auth' < ~/.config/image-classifier/prefect-auth""": "a second host (gpu-0) and the file "
    "make server HOST=0.0.0.0 writes; tests/deployments/test_deployments.py's stack reads it there",
    """. .venv/bin/activate
export PREFECT_API_URL=http://prefect.example.org:4200/api
python -m deployments.auth client -- prefect deployment run train-pipeline/retrain-digits --watch
python -m deployments.auth client -- image-classifier train --processes-per-node 2""": "a server on the network "
    "with basic auth (make server HOST=0.0.0.0): tests/deployments/test_deployments.py runs the same wrapper",
    """make postgres
make server DB=postgresql
make postgres-stop""": "long-running (the server keeps running), and a cluster in the user's own folder on a fixed "
    "port; tests/deployments/test_deployments.py runs these three on a cluster and port of its own",
    """PGPASSWORD="$(cat ~/.local/share/image-classifier/postgres/password)" \\
    pg_dump --format=custom --file prefect.dump postgresql://prefect@127.0.0.1:5433/prefect""": "needs make "
    "postgres's cluster running with a server's runs in it; bench/load.py runs pg_dump and pg_restore on one",
    """make server PREFECT_UI_API_URL=https://prefect.example.org/api
make worker PREFECT_SERVER_URL=https://prefect.example.org/api""": "a TLS proxy at prefect.example.org and a GPU "
    "host: long-running",
}


class Block(NamedTuple):
    page: str
    line: int
    commands: str  # the block without its comments: what RUN and SKIP are keyed by
    text: str  # as pasted


FENCE = re.compile(r"^(?P<indent> *)```(?P<language>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


def commands_of(text: str) -> str:
    lines = (re.sub(r"(^|\s+)#(\s.*)?$", "", line).rstrip() for line in text.splitlines())
    return "\n".join(line for line in lines if line.strip())


def shell_blocks(page: str) -> list[Block]:
    text = (ROOT / page).read_text(encoding="utf-8")
    return [
        Block(page, text.count("\n", 0, m.start()) + 1, commands_of(m["body"]), m["body"])
        for m in FENCE.finditer(text)
        if m["language"].lower() in SHELLS
    ]


def commands_outside_shell_blocks(page: str) -> list[str]:
    """Command lines in other fenced blocks or in indented code blocks: they would not be checked."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        if m["language"].lower() not in SHELLS | {"python"}:
            found += [f"{page}: {line.strip()}" for line in m["body"].splitlines() if COMMAND_LINE.match(line)]
    outside = FENCE.sub("", text)
    found += [
        f"{page}: {line.strip()}"
        for line in outside.splitlines()
        if line.startswith("    ") and COMMAND_LINE.match(line)
    ]
    return found


def test_every_shell_block_is_run_or_skipped_with_a_reason():
    blocks = [block for page in PAGES for block in shell_blocks(page)]
    known = RUN | SKIP | BACKGROUND
    unclassified = [f"{b.page}:{b.line}\n{b.commands}" for b in blocks if b.commands not in known]
    assert not unclassified, "shell blocks neither in RUN nor in SKIP of this file:\n\n" + "\n\n".join(unclassified)
    gone = [commands for commands in known if commands not in {b.commands for b in blocks}]
    assert not gone, "listed here, but no page has these blocks any more:\n\n" + "\n\n".join(gone)
    assert not set(RUN) & set(SKIP) and not set(BACKGROUND) & (set(RUN) | set(SKIP))
    assert all(reason.strip() for reason in SKIP.values())


def test_commands_live_in_shell_blocks():
    hidden = [line for page in PAGES for line in commands_outside_shell_blocks(page)]
    assert not hidden, "commands outside a ```bash block, where this test cannot see them:\n" + "\n".join(hidden)


def test_a_changed_command_is_no_longer_known_but_a_changed_comment_is():
    listed = next(iter(RUN))
    assert commands_of(listed.replace("\n", "   # a comment\n", 1)) == listed
    assert commands_of("# only a comment\n" + listed) == listed
    assert commands_of(listed.replace("image-classifier", "image-classifer", 1)) not in RUN


# --- running them -------------------------------------------------------------------------------------------


def checkout_files() -> list[str]:
    """What a clone holds: the files git would commit (tracked, and new ones not ignored)."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def user_environment(home: Path) -> dict[str, str]:
    """A new user's shell: no virtual environment on the PATH, no PYTHONPATH, no Prefect or AWS settings (the
    machine's locale, temporary folder, terminal and thread count stay)."""
    path = [p for p in os.environ["PATH"].split(os.pathsep) if p and not (Path(p) / "activate").is_file()]
    kept = {
        name: os.environ[name] for name in ("LANG", "LC_ALL", "TMPDIR", "TERM", "OMP_NUM_THREADS") if name in os.environ
    }
    return {**kept, "PATH": os.pathsep.join(path), "HOME": str(home)}


def make_virtual_environment(checkout: Path) -> None:
    """``.venv`` as ``make`` leaves it, without downloading: a venv of this interpreter that sees this environment's
    packages (torch, prefect, …) through a .pth file, the project installed into it (``pip install -e``, so its
    console scripts are the ones pyproject.toml declares), this environment's other commands (prefect, ruff)
    beside them, and make's ``.installed`` stamp."""
    venv = checkout / ".venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (packages / "shared-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-deps"]
        + ["--no-build-isolation", "-e", str(checkout)],
        check=True,
        capture_output=True,
    )
    for command in Path(sys.prefix, "bin").iterdir():
        if not (venv / "bin" / command.name).exists():
            (venv / "bin" / command.name).symlink_to(command)
    (venv / ".installed").touch()


def run_block(text: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def after_make_run(tmp_path_factory) -> Path:
    """A copy of the checkout after ``make run RUN_ARGS="--epochs 1"``: .venv, runs/ (the
    digits, a run folder, logs), registry/digits-resnet18/1, and a HOME holding Prefect's temporary database."""
    base = tmp_path_factory.mktemp("docs")
    checkout = base / "checkout"
    (base / "home").mkdir()
    for name in checkout_files():
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name)
    make_virtual_environment(checkout)
    done = run_block('make run RUN_ARGS="--epochs 1"', checkout, user_environment(base / "home"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Registered digits-resnet18 version 1 in " in done.stdout, done.stdout
    return base


@pytest.mark.integration
@pytest.mark.parametrize("page", [page for page in PAGES if any(b.commands in RUN for b in shell_blocks(page))])
def test_the_page_s_commands_run_as_pasted(page, after_make_run, tmp_path):
    shutil.copytree(after_make_run / "home", tmp_path / "home", symlinks=True)
    checkout = tmp_path / "checkout"
    shutil.copytree(after_make_run / "checkout", checkout, symlinks=True, ignore=shutil.ignore_patterns(".venv"))
    (checkout / ".venv").symlink_to(after_make_run / "checkout" / ".venv")
    with contextlib.ExitStack() as running:
        for block in shell_blocks(page):
            if block.commands in BACKGROUND:
                running.enter_context(in_background(block, checkout, user_environment(tmp_path / "home"), tmp_path))
            elif block.commands in RUN:
                run_and_check(block, checkout, user_environment(tmp_path / "home"))


@contextlib.contextmanager
def in_background(block: Block, cwd: Path, env: dict[str, str], logs: Path):
    """A block that keeps running, started and waited for (its URL answers 200); stopped by SIGTERM when done."""
    from tests.helpers import wait_for  # here: the fast tests of this file import no Prefect

    log = logs / f"background-{block.line}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", block.text],
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
    where = f"{block.page}:{block.line}\n{block.text}"

    def ready() -> bool:
        assert process.poll() is None, f"{where}\nexited {process.returncode}: {log.read_text()}"
        try:
            return urllib.request.urlopen(BACKGROUND[block.commands], timeout=5).status == 200
        except OSError:
            return False

    try:
        wait_for(ready, 300, interval=0.5, what=lambda: f"{where}\nto be ready: {log.read_text()}")
        yield
        # SIGTERM to the server itself, as systemd or Kubernetes send it (make, between, would send its child a
        # second one: stop at once); the server drains and exits 0, and so does the make that ran it.
        for pid in leaves_of_group(process.pid):
            os.kill(pid, signal.SIGTERM)
        assert process.wait(120) == 0, f"{where}\nstopped with {process.returncode}: {log.read_text()}"
        said = log.read_text()
        assert "drained: no request in flight" in said and "Traceback" not in said, f"{where}\n{said}"
    finally:
        if group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def group_members(pgid: int) -> dict[int, int]:
    """The running processes of group ``pgid`` (zombies left out): pid -> parent pid."""
    members = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members[int(stat_file.parent.name)] = int(fields[1])
    return members


def group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def leaves_of_group(pgid: int) -> list[int]:
    """The group's processes that started none of the others: the server a make or a shell runs."""
    members = group_members(pgid)
    return [pid for pid in members if pid not in set(members.values())]


def run_and_check(block: Block, checkout: Path, env: dict[str, str]) -> None:
    done = run_block(block.text, checkout, env)
    said = done.stdout + done.stderr
    where = f"{block.page}:{block.line} exit status {done.returncode}\n{block.text}\n{said}"
    assert done.returncode == 0, where
    expect = RUN[block.commands]
    assert [pattern for pattern in expect.output if not re.search(pattern, said, re.M)] == [], where
    assert [p for p in expect.exists if not (checkout / p).exists()] == [], where
    assert [p for p in expect.absent if (checkout / p).exists()] == [], where
    assert "Traceback" not in said, where
