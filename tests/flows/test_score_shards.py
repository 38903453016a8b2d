"""Scoring in shards over the pool on real components (tests/flows/nodes_stack.py): a Prefect server on
PostgreSQL with the deployments `make deploy` makes, two process workers on the `gpu` pool, the S3 endpoint for
the run folder; one shard's host is lost while it scores."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployments.local import PROJECT_ROOT
from tasks.storage.s3 import list_s3_names, read_s3_object
from tests.flows.nodes_stack import host_env, nodes_stack
from tests.helpers import flow_run_log, lose_host_of, wait_for, write_class_folders

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_home, s3_endpoint, postgres_database):
    with nodes_stack(tmp_path_factory, prefect_home, s3_endpoint, postgres_database("shards")) as running:
        yield running


def score_command(images, model, work: str, output: str, *flags: str) -> list[str]:
    return [
        sys.executable,
        *("-m", "flows.score", str(images), str(model)),
        *("--work-dir", f"{work}/runs", "--output", output, "--batch-size", "4", *flags),
    ]


def scoring_artifact(stack) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        (latest,) = client.read_latest_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["scoring"]))
        )
    return latest.description


def start(stack, command: list[str], host, apart: bool = False) -> subprocess.Popen:
    """``command`` against the stack from a "host" with its cache in folder ``host``, its output read back
    (stderr ``apart`` from stdout, or into it)."""
    stderr = subprocess.PIPE if apart else subprocess.STDOUT
    env = {**stack.env, **host_env(host)}
    return subprocess.Popen(command, env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)


def wait_for_a_running_shard(stack, scoring: subprocess.Popen, work: str, timeout: float = 300):
    """A shard run of the scoring into ``work`` once one is Running; the test fails if the scoring ends first."""

    def running():
        assert scoring.poll() is None, shard_runs_of(stack, work)
        return next((r for r in shard_runs_of(stack, work) if r.state.is_running()), None)

    return wait_for(running, timeout, interval=0.2, what=lambda: f"a running shard: {shard_runs_of(stack, work)}")


def damage_a_stored_image(work: str, timeout: float = 300) -> str:
    """Once a scoring under ``work`` has stored its converted images on S3 (their manifest goes last), overwrite
    one image object there, before a shard fetches it; the image's stored path."""
    from tasks.storage.s3 import parse_s3_uri, s3_client

    manifests = wait_for(
        lambda: [n for n in list_s3_names(work) if n.endswith("/images/image_directory.json")],
        timeout,
        interval=0.25,  # a shard fetches seconds later (a worker's poll, a process's start); each look lists S3
        what="the scoring to store its images",
    )
    images = manifests[0].removesuffix("image_directory.json")
    name = sorted(n for n in list_s3_names(work) if n.startswith(images) and n.endswith(".png"))[-1]
    where = parse_s3_uri(f"{work}/{name}")
    s3_client().put_object(Bucket=where.bucket, Key=where.prefix, Body=b"damaged after it was converted")
    return name.removeprefix(images)


def test_two_shards_over_the_pool_with_a_host_lost_are_the_one_process_table(stack, s3_work, trained_model, tmp_path):
    """The same images and model scored in one process and in two shards, one image damaged on S3 before the
    shards fetch it (max_failed_images 1) and one shard's host lost while it scores (its flow run's process tree
    killed): the lost shard is run again, and the merged table is the one-process table byte for byte but for
    the damaged image's row (no scores, its error), every image once."""
    photos = write_class_folders(tmp_path / "photos", 6, seed=7)  # 18 images: batches of 4, shards of 12 and 6
    one = start(stack, score_command(photos, trained_model, s3_work, f"{s3_work}/one.csv"), tmp_path)
    one_output, _ = one.communicate(timeout=600)
    assert one.returncode == 0, one_output
    flags = ("--shards", "2", "--max-failed-images", "1")
    sharded = start(
        stack, score_command(photos, trained_model, f"{s3_work}/sharded", f"{s3_work}/sharded.csv", *flags), tmp_path
    )
    try:
        damaged = damage_a_stored_image(f"{s3_work}/sharded")
        lost = wait_for_a_running_shard(stack, sharded, f"{s3_work}/sharded")
        lose_host_of(lost)
        output, _ = sharded.communicate(timeout=600)
    finally:
        sharded.kill()
    assert sharded.returncode == 0, output[-5000:] + stack.log_text()[-3000:]

    merged, whole = read_s3_object(f"{s3_work}/sharded.csv").decode(), read_s3_object(f"{s3_work}/one.csv").decode()
    (header, *rows), (one_header, *one_rows) = merged.splitlines(), whole.splitlines()
    assert header == one_header + ",error" and len(rows) == len(set(rows)) == 18, "every image once"
    (bad,) = [i for i, row in enumerate(rows) if not row.endswith(",")]
    assert rows[bad].split(",")[0].endswith(damaged) and "differ from the sha256" in rows[bad], rows[bad]
    assert all(row == one_row + "," for i, (row, one_row) in enumerate(zip(rows, one_rows)) if i != bad), (
        "every other row is the one-process table's, value for value"
    )
    runs = shard_runs_of(stack, f"{s3_work}/sharded")
    assert sorted(r.state.type.value for r in runs) == ["COMPLETED", "COMPLETED", "CRASHED"], runs
    (again,) = [r for r in runs if r.parameters.get("replaces_run")]
    assert again.parameters["replaces_run"] == str(lost.id) and again.name == f"{lost.name}-rerun-1"
    assert again.parameters["shard"] == lost.parameters["shard"]
    assert f"flow run {lost.name!r} crashed" in output and f"run again as '{again.name}'" in output
    assert f"replaces flow run {lost.id}" in flow_run_log(stack.api_url, again.id)
    run_dir = again.parameters["run_dir"]
    assert sorted(n for n in list_s3_names(f"{run_dir}/parts")) == [
        "part-000.csv",
        "part-000.json",
        "part-001.csv",
        "part-001.json",
    ]
    assert scoring_artifact(stack) == "2 of 2 shards done; 18 images scored ({} images/s); 1 failed image".format(
        scoring_artifact(stack).split("(")[1].split()[0]
    )
    assert "18 images scored" in output and "accuracy" in output


def test_more_images_failing_than_allowed_fail_the_run_in_one_line(stack, s3_work, trained_model, tmp_path):
    photos = write_class_folders(tmp_path / "photos", 2, seed=8)  # 6 images: shards of 4 and 2
    work = f"{s3_work}/over"
    sharded = start(
        stack, score_command(photos, trained_model, work, f"{work}/scores.csv", "--shards", "2"), tmp_path, apart=True
    )
    try:
        damaged = damage_a_stored_image(work)
        output, errors = sharded.communicate(timeout=600)
    finally:
        sharded.kill()
    assert sharded.returncode == 2, output + errors
    *progress, line = errors.strip().splitlines()  # Prefect's progress lines, then the one error line
    assert "Traceback" not in errors and not any(p.startswith("error:") for p in progress), errors
    assert line.startswith("error: 1 image could not be scored, more than max_failed_images 0 allows: "), line
    assert damaged in line and "raise max_failed_images" in line
    assert read_s3_object(f"{work}/scores.csv") is None, "no table"


def test_a_shard_past_its_reruns_fails_the_run_in_one_line(stack, s3_work, trained_model, tmp_path):
    """A shard run past a timeout of 0.5 s: it is cancelled and run again, twice; then the scoring fails with one
    line naming its run, the shard, its index rows, its last run and that run's last message, and the log file
    (exit status 1); the tracebacks are in the log file, not on the console."""
    # 4 images, one batch of 4: one shard (3 runs of it in all), the least that runs a shard again.
    photos = write_class_folders(tmp_path / "photos", 2, classes=("red", "green"), seed=9)
    work = f"{s3_work}/timeout"
    flags = ("--shards", "2", "--shard-timeout-s", "0.5")
    sharded = start(
        stack, score_command(photos, trained_model, work, f"{work}/scores.csv", *flags), tmp_path, apart=True
    )
    try:
        _, errors = sharded.communicate(timeout=600)
    finally:
        sharded.kill()
    assert sharded.returncode == 1, errors
    *progress, line = errors.strip().splitlines()  # the scoring's progress lines, then the one error line
    assert "Traceback" not in errors and not any("error:" in p for p in progress), errors
    told = re.fullmatch(
        r"error: run '(?P<run>[\w-]+)' failed: shard 0 \(index rows 0-4\): flow run '(?P=run)-shard-0-rerun-2' ran "
        r"past its timeout of 0.5 s: cancelled, and was run 2 times again; its last message: .+ \(full log: (?P<log>\S+)\)",
        line,
    )
    assert told, line
    log = Path(told["log"]).read_text()
    assert "Traceback" in log and "tasks.errors.ShardFailedError: shard" in log and told["run"] in log


def shard_runs_of(stack, work: str) -> list:
    """The shard runs of the scorings under ``work``, in the order they were made."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("score-shard/score-shard")
        runs = [r for r in client.read_flow_runs() if r.deployment_id == deployment.id]
    return sorted((r for r in runs if r.parameters["run_dir"].startswith(work)), key=lambda r: r.created)


def test_a_sharding_that_cannot_be_is_one_line_before_any_server(tmp_path):
    result = subprocess.run(
        score_command(
            tmp_path, tmp_path / "model", str(tmp_path), "scores.csv", "--shards", "2", "--max-failed-images", "-1"
        ),
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == ["error: max_failed_images -1 is not allowed: use 0 or more"], (
        result.stderr
    )


def test_a_training_and_a_sharded_scoring_ride_out_a_server_stopped_for_20_s(
    stack, s3_work, trained_model, colour_image_dirs, tmp_path
):
    """A training (the command line's own run, torchrun under it) and a sharded scoring (its shards deployment runs
    on the pool's workers) go on while the server is stopped for 20 s and started again, as an upgrade does: both
    commands succeed, no run is Crashed or Failed, and the server's record has every task run each run ran."""
    from tests.helpers import pipeline_command

    began = time.time()
    photos = write_class_folders(tmp_path / "photos", 4, seed=10)  # 12 images: shards of 8 and 4
    work = f"{s3_work}/restart"
    scoring = start(stack, score_command(photos, trained_model, work, f"{work}/scores.csv", "--shards", "2"), tmp_path)
    training_flags = ("--epochs", "3", "--batch-size", "4", "--device", "cpu")
    (trainer := tmp_path / "trainer").mkdir()  # a host of its own
    training = start(
        stack, pipeline_command(*colour_image_dirs, "restart", tmp_path / "work", *training_flags), trainer
    )
    try:
        shard = wait_for_a_running_shard(stack, scoring, work)
        # Stopped once the server has recorded the shard's task run: the events it holds in memory but has not yet
        # recorded are lost when it stops, and a process resends them only if it sends more (docs/operations.md,
        # "Not covered"); what the run sends from here on rides out the stop.
        wait_for(
            lambda: any(n.startswith("score_shard") for n in task_run_names(stack, [("score-shard", shard)])[shard.id]),
            120,
            interval=0.5,
            what="the shard's task run in the server's record",
        )
        down = stack.restart_server(down_s=20)
        scored, _ = scoring.communicate(timeout=600)
        trained, _ = training.communicate(timeout=600)
    finally:
        scoring.kill()
        training.kill()
    print(f"the server did not answer for {down:.0f} s")
    assert down >= 20
    assert scoring.returncode == 0, scored[-5000:] + stack.log_text()[-3000:]
    assert training.returncode == 0, trained[-5000:] + stack.log_text()[-3000:]

    runs = runs_since(stack, began)
    assert sorted(flow for flow, _ in runs) == ["score-pipeline", "score-shard", "score-shard", "train-pipeline"]
    assert all(run.state.is_completed() for _, run in runs), [(run.name, run.state) for _, run in runs]
    # What each ran, by its own account: Prefect's line for each task run that finished, on the command's console;
    # a shard runs its one task. The server records task runs from their events, a moment after they are sent.
    ran = {
        run.id: finished_task_runs({"score-pipeline": scored, "train-pipeline": trained}[flow])
        for flow, run in runs
        if flow != "score-shard"
    }
    assert all(len(names) >= 4 for names in ran.values()), ran
    shards = [run.id for flow, run in runs if flow == "score-shard"]
    missing = {}

    def all_recorded() -> bool:
        recorded = task_run_names(stack, runs)
        missing.clear()
        missing.update({id: names - recorded[id] for id, names in ran.items() if names - recorded[id]})
        missing.update(
            {id: {"score_shard"} for id in shards if not any(n.startswith("score_shard") for n in recorded[id])}
        )
        return not missing

    wait_for(all_recorded, 60, interval=2, what=lambda: f"every task run in the server's record; missing: {missing}")


def runs_since(stack, began: float) -> list[tuple[str, object]]:
    """(flow name, flow run) of every flow run that started since ``began`` (a time.time())."""
    from datetime import datetime, timezone

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterStartTime
    from prefect.settings import PREFECT_API_URL, temporary_settings

    after = datetime.fromtimestamp(began, timezone.utc)
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=after)))
        names = {flow_id: client.read_flow(flow_id).name for flow_id in {run.flow_id for run in runs}}
    return [(names[run.flow_id], run) for run in runs]


def task_run_names(stack, runs) -> dict:
    """The names of the task runs the server has recorded, by flow run id."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ids = [run.id for _, run in runs]
    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=200)
    return {id: {t.name for t in task_runs if t.flow_run_id == id} for id in ids}


def finished_task_runs(output: str) -> set[str]:
    """The task runs a command's console says finished (Prefect's line for each)."""
    return set(re.findall(r"Task run '([^']+)' - Finished in state Completed\(\)", output))
