"""The torchrun worker under real distributed conditions: seeds, two nodes, a killed worker, divergence."""

import os
import shutil
import signal
import threading
from pathlib import Path

import pytest
import torch

from deployments.local import free_port
from tasks.contracts.model_directory import CHECKPOINT_FILE, WEIGHTS_FILE, ModelDirectory, driver_log_path
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import PipelineInputError, TrainingDivergedError, TrainingFailedError
from tasks.launch.torchrun_launcher import launch_training
from tasks.launch.torchrun_output import read_metrics
from tasks.storage.local_files import sha256_file
from tests.helpers import worker_pids

pytestmark = pytest.mark.integration

TIMING_FIELDS = {"train_images_per_s", "seconds"}


def launch(data, spec, output, params, **options):
    train, val = data
    return launch_training(TrainingFolders(train, val, spec, output), params, log=lambda level, line: None, **options)


def figures(model_dir: ModelDirectory) -> list[dict]:
    return [e.model_dump(exclude=TIMING_FIELDS) for e in model_dir.metrics().epochs]


def test_same_seed_and_world_size_give_identical_results_even_through_a_killed_worker(
    tmp_path, trained_model, colour_image_dirs, resnet_spec
):
    """The shared model (the worker's command line, 2 processes, 2 epochs, unbroken) trained again through the
    launcher, one of its workers SIGKILLed after the first epoch: torchrun restarts both (max_restarts 1), they
    resume from the checkpoint, and the figures and the weights are the unbroken run's (epoch boundaries are
    seeded, so a resumed run is the unbroken run)."""
    params = TrainingParams(
        epochs=2, batch_size=4, learning_rate=0.01, processes_per_node=2, device="cpu", max_restarts=1
    )
    output = tmp_path / "killed"
    killed = []

    def kill_after_first_checkpoint(metrics):
        if not killed and 1 <= len(metrics.epochs) < params.epochs:
            pids = worker_pids(output)
            os.kill(pids[-1], signal.SIGKILL)
            killed.append(pids[-1])

    second = launch(
        colour_image_dirs, resnet_spec, output, params, on_metrics=kill_after_first_checkpoint, poll_seconds=0.1
    )

    assert killed, "the training finished before a worker could be killed"
    logs = "".join(driver_log_path(output, rank).read_text() for rank in (0, 1))
    assert "restart 1" in logs and "resuming from" in logs
    first = ModelDirectory(trained_model)
    assert [e.epoch for e in second.metrics().epochs] == [1, 2]
    assert figures(first) == figures(second)
    assert sha256_file(first.weights_path) == sha256_file(second.weights_path)


def test_two_launchers_rendezvous_over_loopback_as_two_nodes(tmp_path, colour_image_dirs, resnet_spec):
    params = TrainingParams(
        epochs=1,
        batch_size=4,
        nodes=2,
        processes_per_node=1,
        device="cpu",
        rendezvous_endpoint=f"127.0.0.1:{free_port()}",
        rendezvous_id="two-nodes-test",
    )
    results, errors = {}, {}

    def node(index):
        try:
            results[index] = launch(colour_image_dirs, resnet_spec, tmp_path / "model", params)
        except Exception as error:  # reported by the assertion below
            errors[index] = error

    nodes = [threading.Thread(target=node, args=(i,)) for i in range(2)]
    for thread in nodes:
        thread.start()
    for thread in nodes:
        thread.join(timeout=240)
    assert not errors and len(results) == 2, errors
    model_dir = results[0]
    assert model_dir.metrics().world_size == 2
    for rank in (0, 1):
        assert f"rank {rank}/2 on cpu (gloo, fp32, contiguous)" in driver_log_path(model_dir.root, rank).read_text()


def test_resuming_at_another_world_size_rescales_the_rate_and_records_the_size(
    tmp_path, colour_image_dirs, resnet_spec
):
    """1 process for epoch 1, then 2 processes for epoch 2 from its checkpoint (as after an elastic rescale)."""
    output = tmp_path / "model"
    params = TrainingParams(epochs=1, batch_size=4, learning_rate=0.01, processes_per_node=1, device="cpu")
    assert launch(colour_image_dirs, resnet_spec, output, params).metrics().world_size == 1
    resumed = launch(
        colour_image_dirs, resnet_spec, output, params.model_copy(update={"epochs": 2, "processes_per_node": 2})
    )
    metrics = resumed.metrics()
    assert metrics.world_size == 2
    # 24 images in batches of 4 on 2 processes: 3 steps an epoch, 6 in all; epoch 2 starts half-way down the
    # linear decay of the rate 0.01 x 2. Kept from the checkpoint, it would have started at 0.01 x 1, at step 6 of 6.
    assert metrics.epochs[1].lr == pytest.approx(0.01 * 2 * 0.5)
    assert "world size 2 (the checkpoint's was 1): learning rate 0.01 (base 0.02 = 0.01 x 2), at step 3 of 6" in (
        driver_log_path(output, 0).read_text()
    )


def test_without_restarts_a_killed_worker_is_named_in_the_error(tmp_path, colour_image_dirs, resnet_spec):
    params = TrainingParams(epochs=4, batch_size=4, processes_per_node=2, device="cpu", max_restarts=0)
    output, killed = tmp_path / "model", {}

    def kill_rank_one(metrics):
        if not killed and (pids := worker_pids(output)):
            ranks = {
                int(
                    dict(v.split("=", 1) for v in Path(f"/proc/{p}/environ").read_text().split("\0") if "=" in v)[
                        "RANK"
                    ]
                ): p
                for p in pids
            }
            os.kill(ranks[1], signal.SIGKILL)
            killed[1] = ranks[1]

    with pytest.raises(TrainingFailedError) as error:
        launch(colour_image_dirs, resnet_spec, output, params, on_metrics=kill_rank_one, poll_seconds=0.1)
    assert killed and error.value.rank == 1
    assert "rank 1 first, exit code -9 (SIGKILL)" in str(error.value)
    assert "driver_log_1.txt" in str(error.value)


def test_divergence_stops_with_advice_and_keeps_the_best_model(tmp_path, trained_model, colour_image_dirs, resnet_spec):
    output = tmp_path / "model"
    shutil.copytree(trained_model, output)
    best_before = sha256_file(output / WEIGHTS_FILE)
    # A learning rate no network survives, planted in the resume state.
    checkpoint = torch.load(output / CHECKPOINT_FILE, weights_only=True)
    checkpoint["scheduler"]["base_lrs"] = [1e30]
    torch.save(checkpoint, output / CHECKPOINT_FILE)

    params = TrainingParams(epochs=4, batch_size=4, learning_rate=0.01, processes_per_node=2, device="cpu")
    with pytest.raises(TrainingDivergedError) as error:
        launch(colour_image_dirs, resnet_spec, output, params)
    assert "lower the learning rate" in error.value.log_tail
    # The advice is the first line a person sees (the UI's state message), with the rate that really applied.
    headline = str(error.value).splitlines()[0]
    assert headline.startswith("training diverged: lower the learning rate: the effective rate 0.02 "), headline
    assert "(learning_rate 0.01 x 2 processes)" in headline
    assert isinstance(error.value, PipelineInputError), "divergence must not be retried"
    assert sha256_file(output / WEIGHTS_FILE) == best_before
    assert len(read_metrics(output).epochs) == 2


def test_out_of_range_parameters_are_rejected_before_anything_launches():
    """The check Prefect makes of a flow's parameters before its run starts (Flow.validate_parameters): no server
    needed to see that a run with them never begins."""
    from prefect.exceptions import ParameterTypeError

    from flows.pipeline import train_pipeline

    assert train_pipeline.validate_parameters({"training": {"epochs": 1}})["training"].epochs == 1
    for bad in ({"epochs": 0}, {"batch_size": -1}, {"learning_rate": 0}, {"patience": 0}, {"warmup_epochs": -1}):
        with pytest.raises(ParameterTypeError, match=next(iter(bad))):
            train_pipeline.validate_parameters({"training": bad})
