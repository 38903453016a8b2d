"""A sweep through the work pool on real components (tests/flows/nodes_stack.py): a Prefect server with the
deployments `make deploy` makes, two process workers on the `gpu` pool (one training each at a time), each trial a
real torchrun training; the best trial registered with the sweep's record."""

import json
import re
import subprocess
from pathlib import PurePosixPath

import pytest

from deployments.local import PROJECT_ROOT
from tasks.contracts.model_directory import SWEEP_PICTURES
from tasks.launch.lost_runs import epochs_stored
from tasks.registry import read_registration
from tasks.storage.s3 import list_s3_names, read_s3_object
from tasks.sweep.study import STUDY_FILE
from tests import helpers
from tests.flows.nodes_stack import HOSTS, host_env, nodes_stack
from tests.helpers import flow_run_log, heartbeats_of, lose_host_of, training_processes, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prefect_home, s3_endpoint, postgres_database):
    with nodes_stack(tmp_path_factory, prefect_home, s3_endpoint, postgres_database("sweep")) as running:
        yield running


def states(runs) -> list[tuple]:
    return [(r.name, r.state) for r in runs]


def trial_runs(stack, output_under):
    """The runs of the sweep-trial deployment whose model folder is under ``output_under``, by trial number (a
    trial run again: its runs in the order they were made)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("sweep-trial/sweep-trial")
        runs = [r for r in client.read_flow_runs() if r.deployment_id == deployment.id]
    mine = [r for r in runs if r.parameters["folders"]["output_dir"].startswith(str(output_under))]
    return sorted(mine, key=lambda r: (r.parameters["trial"], r.created))


def states_of(stack, run) -> list:
    """Every state a flow run went through (the worker's last message replaces the canceller's)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        return client.read_flow_run_states(run.id)


def sweep_command(colour_image_dirs, work, name: str, space: dict, *flags: str) -> list[str]:
    """`python -m flows.sweep` on the colour images, from scratch on the CPU, batches of 4, over ``space``."""
    return helpers.pipeline_command(
        *colour_image_dirs,
        name,
        work,
        *("--batch-size", "4", "--device", "cpu", "--search-space", json.dumps(space), *flags),
        module="flows.sweep",
    )


def most_at_once(runs) -> int:
    """The most runs that were running at one moment (from their start and end times)."""
    events = sorted([(r.start_time, 1) for r in runs] + [(r.end_time, -1) for r in runs], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


# Enough epochs that the lost trial's re-run ends while the poor trial still trains: the pruner waits for two
# completed trials before it judges one. 12 lost that race in two of four clean clones on a loaded 2-core machine
# (the poor trial finished first); 20 widens it by 8 of the poor trial's epochs.
EPOCHS = "20"


def test_a_sweep_on_s3_killed_and_resumed_on_another_host_trains_two_at_a_time_prunes_a_poor_trial_and_registers_the_best(
    stack, s3_work, colour_image_dirs, tmp_path
):
    """Work dir and registry on S3; two trials at a time on the two hosts, then a third. The sweep's process is
    killed (SIGKILL) while its first two trials train; `--resume` with its run folder, from a host with an empty
    cache (the study comes back from S3), re-attaches to both and trains only the third. The second trial's host
    is lost after its first epoch: its run crashes, and the sweep runs it again, through its own queue, to resume
    from the checkpoint on S3. The third (a learning rate far too small, drawn by the resumed sweep) is worse than
    the median once it may be pruned, so the sweep cancels its flow run through the API and marks it pruned. The
    best trial is registered with the sweep's record and pictures."""
    space = {"learning_rate": {"kind": "choice", "values": [0.01, 1e-7]}, "weight_decay": None}
    command = sweep_command(
        colour_image_dirs,
        s3_work,
        "colours-sweep",
        space,
        *("--epochs", EPOCHS, "--patience", EPOCHS, "--trials", "3", "--parallel", "2", "--pruner", "median"),
        *("--sampler", "random", "--seed", "6"),  # seed 6 draws 0.01 and 0.01, then (resumed after two) 1e-7
    )
    first = subprocess.Popen(
        command,
        env={**stack.env, **host_env(tmp_path / "first-host")},
        cwd=PROJECT_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def two_trials_running() -> bool:
        runs = trial_runs(stack, f"{s3_work}/runs")
        assert first.poll() is None, states(runs)
        return len(runs) == 2 and all(r.state.is_running() for r in runs)

    try:
        wait_for(
            two_trials_running,
            600,
            interval=1,
            what=lambda: f"two trials running: {states(trial_runs(stack, f'{s3_work}/runs'))}",
        )
    finally:
        first.kill()  # SIGKILL: no cleanup of any kind
        first.wait()
    (run_dir,) = {f"{s3_work}/runs/{name.split('/')[0]}" for name in list_s3_names(f"{s3_work}/runs")}

    resumed = subprocess.Popen(
        [*command, "--resume", run_dir],
        env={**stack.env, **host_env(tmp_path / "second-host")},
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def second_trial_stored_an_epoch():
        runs = trial_runs(stack, run_dir)
        assert resumed.poll() is None, states(runs)
        stored = runs[1].state.is_running() and (epochs_stored(f"{run_dir}/trials/trial-001/model") or 0) >= 1
        return runs[1] if stored else None

    try:
        # The second trial's host is lost once the trial has stored an epoch: its flow run's process and the
        # training it started stop at once; the worker, as a pool's other host would, reports the run Crashed.
        lost = wait_for(
            second_trial_stored_an_epoch,
            600,
            interval=0.5,
            what=lambda: f"an epoch of the second trial: {states(trial_runs(stack, run_dir))}",
        )
        lose_host_of(lost)
        output, _ = resumed.communicate(timeout=900)
    finally:
        resumed.kill()
    assert resumed.returncode == 0, output[-5000:] + stack.log_text()[-3000:]
    check_the_killed_attempt_is_crashed_and_linked(stack)

    registration = read_registration(f"{s3_work}/registry", "colours-sweep", 1)
    record = registration.params["sweep"]
    trials = record["trials"]
    assert [t["params"]["learning_rate"] for t in trials] == [0.01, 0.01, 1e-7]
    assert [t["state"] for t in trials] == ["complete", "complete", "pruned"], trials
    epochs = int(EPOCHS)
    assert [t["epochs"] for t in trials[:2]] == [epochs] * 2 and 2 <= trials[2]["epochs"] < epochs, (
        "pruned after its warm-up"
    )
    best = max(trials[:2], key=lambda t: t["value"])
    assert record["best_trial"] == best["number"]
    assert registration.params["training"]["learning_rate"] == best["params"]["learning_rate"]

    runs = trial_runs(stack, run_dir)
    assert [r.parameters["trial"] for r in runs] == [0, 1, 1, 2], (
        "the running trials were re-attached, not trained again"
    )
    assert [r.state.type.value for r in runs] == ["COMPLETED", "CRASHED", "COMPLETED", "CANCELLED"], runs
    assert any("pruned by its sweep after epoch" in (state.message or "") for state in states_of(stack, runs[3]))
    assert [str(r.id) for r in (runs[0], runs[2], runs[3])] == [t["flow_run_id"] for t in trials]
    assert most_at_once(runs) == 2, [(r.name, r.start_time, r.end_time) for r in runs]

    # The crashed trial was run again through the sweep's own queue (its cap), and went on from its checkpoint.
    rerun = runs[2]
    assert rerun.parameters["replaces_run"] == str(lost.id) == str(runs[1].id)
    assert f"trial 1: flow run {lost.name!r} crashed" in output and f"run again as '{lost.name}-rerun-1'" in output
    # The host is lost once an epoch is stored; under load more may be stored before the kill lands.
    log = flow_run_log(stack.api_url, rerun.id)
    found = re.search(r"resuming from its last checkpoint \(epoch (\d+) or later\)", log)
    assert found and 1 <= int(found[1]) <= epochs, log[:3000]
    resumed_at = re.search(r"resuming from \S+ after epoch (\d+)", log)  # the checkpoint may be ahead of metrics.json
    assert resumed_at and int(found[1]) <= int(resumed_at[1]) <= epochs, "the re-run went on from that checkpoint"

    # Two at a time is the sweep's own work queue's limit (Prefect's, not only the flow's); gone once it is done.
    queue = PurePosixPath(run_dir).name
    assert {r.work_queue_name for r in runs} == {queue}
    assert f"trials go to work queue '{queue}' of pool 'gpu': at most 2 at once" in output, output[-3000:]
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        assert queue not in {q.name for q in client.read_work_queues(work_pool_name="gpu")}
        # The version carries the sweep's pictures, and its model card shows them with the trials.
        assert set(SWEEP_PICTURES) <= set(registration.files)
        cards = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["model-card-colours-sweep"]))
        )
    card = max(cards, key=lambda a: a.created)
    assert f"best of 3 trials by top1: trial {best['number']}" in card.data
    for caption in SWEEP_PICTURES.values():
        assert f"![{caption}](data:image/png;base64," in card.data
    assert read_s3_object(f"{run_dir}/sweep/{STUDY_FILE}"), "the study is stored beside the run's files"
    assert not any(training_processes(stack.folders[host]) for host in HOSTS), "a training process was left running"


def check_the_killed_attempt_is_crashed_and_linked(stack) -> None:
    """The killed sweep's run beat while it lived, tagged for the automation `make deploy` made (it sets such a run
    Crashed once its beats stop: docs/operations.md), and the resume set it Crashed at once, naming the run that
    goes on; the two runs link to each other."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.automations import ZOMBIE_AUTOMATION

    with temporary_settings({PREFECT_API_URL: stack.api_url}), get_client(sync_client=True) as client:
        sweeps = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sweep-pipeline"])))
        killed, going_on = sorted(sweeps, key=lambda run: run.created)
        (automation,) = client.read_automations_by_name(ZOMBIE_AUTOMATION)
        artifacts = {
            (artifact.key, str(artifact.flow_run_id)): artifact.data
            for artifact in client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[killed.id, going_on.id]))
            )
        }
    assert heartbeats_of(stack.api_url, killed.id) >= 1, "a command line's own run beats"
    (watched,) = automation.trigger.match_related["prefect.resource.id"]
    assert watched.removeprefix("prefect.tag.") in killed.tags, (watched, killed.tags)
    by_resume = f"Its process stopped without a final state; the sweep was resumed by run {going_on.name}."
    # On a slow host the automation may have set it Crashed (no beat for its window) before the resume started: the
    # resume then leaves that state and names it.
    message = killed.state.message
    assert killed.state.is_crashed() and (message == by_resume or message.startswith("No heartbeat")), killed.state
    line = f"Resumes the sweep of run {killed.name} (Crashed: {message.rstrip('.')})"
    assert line in flow_run_log(stack.api_url, going_on.id)
    assert f"/runs/flow-run/{killed.id})" in artifacts["resumed-run", str(going_on.id)]
    assert f"/runs/flow-run/{going_on.id})" in artifacts["resumed-by", str(killed.id)]
