"""Sharded scoring (score_pipeline --shards, tasks/score_shards) against one-process scoring: the same images and
model scored through `python -m flows.score` in the flow's own process (at one compute thread, a shard's share,
and at every core, what one process gets alone) and with 2 shards (runs of the score-shard deployment on two
process workers of the `gpu` pool, one compute thread each), in turn, on one Prefect server; then the merge of a
million-row table, timed and its peak memory read, in a fresh process.

    python -m bench.score_fanout                     # the digits' 1,437 training images at 64 px, 2 repetitions
    python -m bench.score_fanout --copies 4 --image-size 96 --repetitions 1 --merge-rows 1000000

For each side: the command's wall time, images per second over it, and for the shards the fixed overhead per
shard (its flow run's start to its first batch scored: the worker's process start, imports, fetching the model
and images) and the merge. On a 2-core machine two shards cannot be much faster than one process: the ratio
shows the overhead, not a speed-up. Goals (issue 41): overhead per shard <= 10 s; a 1,000,000-row merge in
<= 30 s and <= 500 MB. The network has random weights: throughput does not depend on what it learned.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import PROJECT_ROOT, Figure, table
from deployments.local import PrefectStack


def scoring(stack: PrefectStack, images: Path, model: Path, work: Path, shards: int, threads: int = 1) -> dict:
    """One `python -m flows.score` run (its process with ``threads`` compute threads); its wall time, and for
    shards each shard's overhead and the merge."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.score_shards.parts import read_summary

    output = work / f"scores-{shards}-{time.monotonic_ns()}.csv"
    command = [
        *(sys.executable, "-m", "flows.score", str(images), str(model), "--output", str(output)),
        *("--work-dir", str(work / "runs"), "--shards", str(shards)),
    ]
    started = time.monotonic()
    env = {**stack.env, "OMP_NUM_THREADS": str(threads)}
    result = subprocess.run(command, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])
    figures = {"wall s": wall, "rows": len(output.read_text().splitlines()) - 1, "output": output}
    if shards > 1:
        with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("score-shard/score-shard")
            runs = [r for r in client.read_flow_runs() if r.deployment_id == deployment.id]
        mine = [r for r in runs if r.parameters["run_dir"].startswith(str(work / "runs"))]
        latest = sorted(mine, key=lambda r: r.created)[-shards:]
        overheads = []
        for run in latest:
            part = read_summary(
                str(Path(run.parameters["run_dir"], "parts", f"part-{run.parameters['shard']['shard']:03d}.csv"))
            )
            overheads.append(part.first_image_at - run.start_time.timestamp())
        figures["overhead s"] = max(overheads)
        merged = [
            line for line in result.stderr.splitlines() + result.stdout.splitlines() if "parts merged into" in line
        ]
        figures["merge s"] = float(merged[-1].rsplit(" in ", 1)[1].split()[0]) if merged else float("nan")
    return figures


MERGE_SCRIPT = """
import json, re, sys, time
from tasks.score_shards.parts import PartSummary, merge_parts
parts, summaries, output = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
started = time.perf_counter()
merge_parts(parts, [PartSummary.model_validate(s) for s in summaries], output)
print(json.dumps({"seconds": time.perf_counter() - started,
                  # VmHWM, not ru_maxrss: that one keeps the forking parent's peak across exec
                  "peak_mb": int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read())[1]) / 1024}))
"""


def merge_million(folder: Path, rows: int, shards: int, classes: int, failed: bool) -> dict:
    """Parts of ``rows`` rows (``classes`` probability columns, float32 as scoring writes them) merged in a fresh
    process: its seconds and peak resident memory (the interpreter and pandas included). With ``failed``, one
    image per part has no scores: the merge then parses each part to add the error column."""
    import numpy as np
    import pandas as pd

    from tasks.contracts.scores_table import write_scores
    from tasks.score_shards.parts import FailedImage, PartSummary, part_location, shard_ranges

    rng = np.random.default_rng(0)
    names = [f"class-{c:02d}" for c in range(classes)]
    parts, summaries = [], []
    for r in shard_ranges(rows, shards, 64):
        part = part_location(str(folder), r.shard)
        if not Path(part).is_file():
            probabilities = rng.dirichlet(np.ones(classes), size=r.stop - r.start).astype(np.float32)
            table = pd.DataFrame({"image": [f"photos/{i:07d}.jpg" for i in range(r.start, r.stop)]})
            table["Scored Labels"] = [names[i] for i in probabilities.argmax(axis=1)]
            for c, name in enumerate(names):
                table[f"Scored Probabilities_{name}"] = probabilities[:, c]
            write_scores(table, part)
        bad = (
            [FailedImage(row=r.start, image=f"photos/{r.start:07d}.jpg", error="OSError: truncated")] if failed else []
        )
        summaries.append(PartSummary(shard=r.shard, start=r.start, stop=r.stop, rows=r.stop - r.start, failed=bad))
        parts.append(part)
    output = folder / f"merged-{failed}.csv"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            MERGE_SCRIPT,
            json.dumps(parts),
            json.dumps([s.model_dump() for s in summaries]),
            str(output),
        ],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["bytes"] = output.stat().st_size
    output.unlink()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, default=1, help="the digits' training images this many times over")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--merge-rows", type=int, default=1_000_000)
    parser.add_argument("--merge-parts", type=int, default=8)
    args = parser.parse_args()
    from bench.score import random_model_directory
    from tasks.data.datasets import export_digits

    with tempfile.TemporaryDirectory(prefix="bench-score-fanout-") as scratch:
        scratch = Path(scratch)
        train, _ = export_digits(scratch / "digits")
        images = scratch / "images"
        for source in train.rglob("*.png"):
            (images / source.parent.name).mkdir(parents=True, exist_ok=True)
            for copy in range(args.copies):
                shutil.copyfile(source, images / source.parent.name / f"{source.stem}-{copy}.png")
        count = sum(1 for _ in images.rglob("*.png"))
        classes = sorted(p.name for p in train.iterdir())
        model = random_model_directory(scratch / "model", "resnet18", classes, args.image_size).root
        cores = os.cpu_count() or 1
        # One process at one thread (a shard's compute), one process at every core (what it gets alone), two shards.
        plan = {"1 process, 1 thread": (1, 1), f"1 process, {cores} threads": (1, cores), "2 shards": (2, 1)}
        sides: dict[str, list[dict]] = {name: [] for name in plan}
        with PrefectStack(home=scratch / "prefect", settings={"OMP_NUM_THREADS": "1"}) as stack:
            stack.deploy()
            for host in ("host-a", "host-b"):
                (scratch / host).mkdir()
                stack.start_worker("gpu", host, limit=1, cwd=scratch / host)
            for repetition in range(args.repetitions):
                for name, (shards, threads) in plan.items():
                    figures = scoring(stack, images, model, scratch / "work", shards, threads)
                    sides[name].append(figures)
                    print(f"repetition {repetition}, {name}: {figures}", flush=True)
            one, two = (sides[name][-1]["output"].read_bytes() for name in ("1 process, 1 thread", "2 shards"))
            print("the 2-shard table equals the 1-process table:", one == two)
        merge_dir = scratch / "merge"
        plain = merge_million(merge_dir, args.merge_rows, args.merge_parts, 10, failed=False)
        with_errors = merge_million(merge_dir, args.merge_rows, args.merge_parts, 10, failed=True)
    wall = {name: statistics.median(f["wall s"] for f in runs) for name, runs in sides.items()}
    overhead = statistics.median(f["overhead s"] for f in sides["2 shards"])
    merge = statistics.median(f["merge s"] for f in sides["2 shards"])
    setting = f"{count} images, resnet18 at {args.image_size} px, batch 64, CPU; a shard's process 1 thread"
    alone = f"1 process, {cores} threads"
    figures = [
        Figure(
            "images/s end to end, 2 shards vs 1 process at 1 thread",
            count / wall["2 shards"],
            count / wall["1 process, 1 thread"],
            "images/s",
            "-",
            notes=setting,
        ),
        Figure(
            f"images/s end to end, 2 shards vs {alone}",
            count / wall["2 shards"],
            count / wall[alone],
            "images/s",
            f"(on {cores} cores: the overhead)",
        ),
        Figure("overhead per shard (run start to first batch)", overhead, None, "s", "<= 10 s", 10, False),
        Figure(f"merge of the {count}-row table", merge * 1000, None, "ms", "-"),
        Figure(
            f"merge of {args.merge_rows:,} rows, {args.merge_parts} parts",
            plain["seconds"],
            None,
            "s",
            "<= 30 s",
            30,
            False,
        ),
        Figure("peak memory of that merge", plain["peak_mb"], None, "MB", "<= 500 MB", 500, False),
        Figure("the same with a failed image per part", with_errors["seconds"], None, "s", "<= 30 s", 30, False),
        Figure("peak memory of that merge", with_errors["peak_mb"], None, "MB", "<= 500 MB", 500, False),
    ]
    print(f"\n{setting}; {args.repetitions} repetitions, medians; merged table {plain['bytes'] / 1e6:.0f} MB")
    print(table(figures))


if __name__ == "__main__":
    main()
