"""The benchmark scripts run (small settings, real code paths). Nothing here asserts a speed: the figures only
have to be measured — positive numbers with the names and units BENCHMARKS.md reports."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from deployments.local import PROJECT_ROOT

pytestmark = pytest.mark.integration


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU stand-in; a CUDA host measures the real figure")
def test_accelerator_benchmark_runs_its_cpu_stand_in(capsys):
    """Every path but torch.compile (minutes of C++ compiling on a CPU; tests/training/test_loop.py compiles a small
    network): the loading ceilings, a baseline copy of the code (here this checkout itself) in a process of its own,
    the worker, the device ceiling and the profile of the worker's loop."""
    from bench.gpu import figures

    loading, training, versus = figures(
        images=48, baseline=PROJECT_ROOT, compile=False, loading=True, ceiling_seconds=1
    )
    assert loading.name.startswith("data-loading ceiling") and loading.ours > 0 and loading.baseline > 0
    assert training.name.startswith("training resnet18") and training.target == "pending: no GPU"
    assert training.ours > 0 and training.met is None and "by this loader process" in training.notes
    assert "of the device ceiling" in training.notes
    assert versus.ours == training.ours and versus.baseline > 0, "the baseline copy trained in its own process"
    profile = capsys.readouterr().out
    assert "resnet18 @64px, batch 32, eager, on cpu:" in profile and "host: wait for the next batch" in profile


def test_scoring_benchmark_measures_ours_against_the_naive_loop_in_a_fresh_process(colour_image_dirs):
    from bench.score import figures

    # The test's few colour images, not the digits' 360: the same paths, each image scored by both.
    (figure,) = figures(images=str(colour_image_dirs[1]), image_sizes=(0,), repetitions=1)
    assert figure.name == "scoring images at 32 px" and figure.unit == "images/s"
    assert figure.ours > 0 and figure.baseline > 0 and figure.ratio is not None


def test_device_stage_benchmark_times_each_stage_of_the_device_pipeline():
    from bench.device_stages import stages

    rows = stages(images=16, batch=8, batches=1)
    assert [row.split("  ")[0] for row in rows] == [
        "decode_jpeg (batched)",
        "decode + resize (decode)",
        "crop + flip (augment)",
        "augment + normalise (finish)",
        "the whole pipeline",
    ]
    assert all(" ms/batch " in row and "images/s   host CPU " in row and "% of wall)" in row for row in rows)


def test_step_benchmark_compares_each_variant_with_the_default():
    result = subprocess.run(
        [sys.executable, "-m", "bench.step", "--steps", "2", "--repetitions", "1", "--batch", "2"],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for variant in ("default", "fused SGD", "kept blocks", "fused SGD + kept blocks (ours)"):
        assert any(line.startswith(variant) and "page faults/step" in line for line in result.stdout.splitlines())
    assert result.stdout.count("vs default") == 3


def test_fanout_benchmark_takes_the_last_rank_to_start_training(tmp_path):
    """bench.fanout itself runs two pipelines on a Prefect stack (minutes): here only its reading of the ranks' logs,
    in the worker's own log format."""
    from bench.fanout import training_started

    logs = tmp_path / "model" / "logs"
    logs.mkdir(parents=True)
    (logs / "driver_log_0.txt").write_text(
        "2026-11-22 18:40:01,100 [rank 0] INFO rank 0/2 on cpu\n"
        "2026-11-22 18:40:05,250 [rank 0] INFO training resnet18 on 24 images\n"
    )
    (logs / "driver_log_1.txt").write_text("2026-11-22 18:40:07,500 [rank 1] INFO training resnet18 on 24 images\n")
    assert training_started(tmp_path / "model").strftime("%H:%M:%S.%f") == "18:40:07.500000"


def test_near_duplicate_benchmark_measures_grouping_quality_and_cost():
    from bench.near_duplicates import conversion_cost, quality, split_cost

    table = quality()
    photos = int(table[0].split(" photos (china, flower, hopper")[0])  # 23 with scikit-image's (the bench extra)
    assert photos >= 3 and table[0].endswith(f"; {4 * photos} quarters")
    assert any(line.startswith("| different quarters: pairs grouped (false merges) of ") for line in table)
    assert any(line.startswith("| JPEG quality 40: copies grouped with their photo") for line in table)
    split, lookup = split_cost(3000, 1)
    assert "split of 3,000 images (80/20), median of 1: identical files only " in split and split.endswith("x")
    assert "near-duplicate groups" in lookup
    assert conversion_cost(2, 1).startswith("conversion of 2 JPEGs of 3,000 x 2,000, median of 1: without the hash")


def test_score_fanout_benchmark_measures_a_merge_in_a_fresh_process(tmp_path):
    """The merge half of bench/score_fanout.py, small: its time and its own peak memory (VmHWM, not the forking
    parent's); the scoring half runs a Prefect stack (tests/flows/test_score_shards.py runs that path)."""
    from bench.score_fanout import merge_million

    for failed in (False, True):
        figures = merge_million(tmp_path, 3000, 3, 4, failed=failed)
        assert figures["seconds"] > 0 and 20 < figures["peak_mb"] < 400 and figures["bytes"] > 3000 * 40


def test_serve_benchmark_reads_the_endpoint_batch_histogram():
    """bench/serve.py's reading of the endpoint's own /metrics text: batches per bucket between two scrapes."""
    from prometheus_client import generate_latest

    from bench.serve import batch_histogram, histogram_between
    from tasks.serving.metrics import ServeMetrics

    metrics = ServeMetrics()
    before = batch_histogram(generate_latest(metrics.registry).decode())
    for size, version in ((1, "m/1"), (3, "m/1"), (16, "m/1"), (16, "m/2"), (5, "m/2")):
        metrics.batch_size.labels(version).observe(size)
        metrics.forward_seconds.labels(version).observe(0.1)
    batches = histogram_between(before, batch_histogram(generate_latest(metrics.registry).decode()))
    assert batches["buckets"] == {"1": 1, "3-4": 1, "5-8": 1, "9-16": 2}
    assert batches["batches"] == 5 and batches["mean"] == 41 / 5 and round(batches["forward_ms_mean"]) == 100


def test_serve_benchmark_runs_the_plain_server_under_load(tmp_path):
    """One short level of the plain FastAPI server (a real subprocess, the closed-loop load, its peak memory, the
    record); ours and LitServe take the same paths with other commands (each several seconds to start)."""
    from bench.serve import main

    out = tmp_path / "serve.json"
    main(["--only", "plain", "--concurrency", "2", "--seconds", "1", "--warmup", "0.5", "--output", str(out)])
    record = json.loads(out.read_text())
    (level,) = record["levels"]
    assert level["server"] == "plain" and level["concurrency"] == 2 and level["errors"] == 0
    assert level["ok"] > 0 and level["requests_per_s"] > 0 and level["p99_ms"] >= level["p50_ms"] > 0
    assert level["batches"]["mean"] == 1.0 and level["peak_rss_mb"] > 100
    assert record["swap"] is None and record["figures"] == []


def test_monitor_benchmark_sends_digits_the_training_never_saw_and_inverts_them(tmp_path):
    """bench.monitor itself trains twice and serves (minutes): here its traffic, held out of training and validation,
    and its shift."""
    import hashlib
    import io

    import numpy as np
    from PIL import Image

    from bench.monitor import digits_three_ways, shifted

    train, validation, held_out = digits_three_ways(tmp_path, seed=1)
    seen = {hashlib.sha256(p.read_bytes()).digest() for folder in (train, validation) for p in folder.rglob("*.png")}
    assert len(seen) > 1000 and len(held_out) == 360 and sorted({label for _, label in held_out}) == list(range(10))
    assert not seen & {hashlib.sha256(image).digest() for image, _ in held_out}
    image = held_out[0][0]
    original, inverted = (np.asarray(Image.open(io.BytesIO(data))) for data in (image, shifted(image)))
    assert np.array_equal(inverted, 255 - original)


def test_the_suite_cpu_benchmark_counts_what_a_clean_clones_command_starts_by_kind(tmp_path):
    """bench.suite_cpu on a command of a few seconds instead of `.ci/run`: a clone of this checkout's HEAD, every
    process under the command sampled, its CPU counted by kind; an unknown revision is one line."""
    from bench.suite_cpu import kind_of, main

    assert kind_of("/venv/bin/python -u -m tasks.training.worker --train /data") == "training worker"
    agent = "/venv/bin/python -m torch.distributed.run --standalone -m tasks.training.worker --train /data"
    assert kind_of(agent) == "torchrun agent"
    assert kind_of("/venv/bin/python -m prefect server start --host 127.0.0.1 --port 5") == "Prefect server"
    assert kind_of("/venv/bin/python -m flows.pipeline --epochs 1") == "pipeline command line"
    out = tmp_path / "suite-cpu.json"
    burn = "sum(range(10**8))"  # a second or two of one core in a child of the command: sampled (0.5 s apart)
    command = f"test -f .ci/run && {sys.executable} -c '{burn}' && {sys.executable} -m pytest --version"
    assert main(["HEAD", "--rounds", "1", "--command", command, "--output", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["returncode"] == 0 and run["last_line"].startswith("pytest ")
    assert run["kinds"]["other"]["cpu_s"] >= 0.5
    (burnt, burner), *_ = run["kinds"]["other"]["heaviest"]  # what the kind holds, heaviest first
    assert burnt >= 0.5 and burn in burner, run["kinds"]["other"]
    assert run["cpu_s"] == round(sum(kind["cpu_s"] for kind in run["kinds"].values()), 1)
    assert main(["no-such-revision"]) == 2


def test_a_failed_suite_run_keeps_why_its_tests_failed():
    """bench.suite_cpu's record of a failed run: pytest's failure report, not only the tail that names the test."""
    from bench.suite_cpu import failures

    said = ["collected 3 items", "..F", "=" * 20 + " FAILURES " + "=" * 20, "_ test_late _", "E   AssertionError: late"]
    said += ["=" * 10 + " short test summary info " + "=" * 10, "FAILED tests/test_x.py::test_late", "= 1 failed ="]
    assert failures(said) == said[2:5] and failures(said, most=1) == ["E   AssertionError: late"]
    assert failures(["collected 1 item", ".", "= 1 passed ="]) == []


def test_the_per_test_cpu_plugin_charges_each_test_what_its_cgroup_counted(tmp_path):
    """bench.per_test_cpu's plugin in a pytest run of two tests, on a stand-in for the cgroup's counter (v1's
    nanoseconds) that each test moves on as the kernel would; its report names the file and the test that grew;
    both cgroup formats are read."""
    from bench.per_test_cpu import COUNTER, RECORDS, cpu_seconds, dumps, report

    counter, records = tmp_path / "cpuacct.usage", tmp_path / "records.jsonl"
    counter.write_text("0\n")
    (tmp_path / "test_two.py").write_text(
        textwrap.dedent(f"""
        from pathlib import Path
        COUNTER = Path({str(counter)!r})
        def spend(seconds):
            COUNTER.write_text(str(int(COUNTER.read_text()) + int(seconds * 1e9)))
        def test_cheap():
            spend(0.5)
        def test_dear():
            spend(3.25)
        """)
    )
    environment = {**os.environ, COUNTER: str(counter), RECORDS: str(records), "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "bench.per_test_cpu", "-p", "no:cacheprovider"]
    ran = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    tests = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(nodeid, cpu) for nodeid, cpu, _ in tests] == [
        ("test_two.py::test_cheap", 0.5),
        ("test_two.py::test_dear", 3.25),
    ]

    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    assert cpu_seconds(stat) == 2.5 and cpu_seconds(counter) == 3.75
    run = {"commit": "c", "returncode": 0, "last_line": "", "wall_s": 1, "cgroup_cpu_s": 9}
    base = {**run, "revision": "base", "tests_cpu_s": 3.75, "tests": tests}
    head = {**run, "revision": "head", "tests_cpu_s": 5.75, "tests": [*tests, ["test_new.py::test_it", 2.0, 2.0]]}
    said = report(base, head)
    assert "tests: +2.0 CPU-s (+53.3%) head vs base" in said
    assert "      +2.0         0.0         2.0  test_new.py\n" in said, said
    assert "      +2.0         0.0         2.0  test_new.py::test_it\n" in said, said
    written = dumps({"runs": [base, head]})
    assert json.loads(written) == {"runs": [base, head]}
    assert '    ["test_new.py::test_it", 2.0, 2.0]\n' in written  # a test to a line
