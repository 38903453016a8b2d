"""tasks/launch/torchrun_launcher.py: the torchrun command, the workers' environment, and what a launch of a real torchrun
refuses or reports (staged weights changed, CUDA missing, a failing worker)."""

import logging
import shutil

import pytest
import torch
import torchvision

from tasks.contracts.model_directory import (
    STAGED_WEIGHTS_FILE,
    ModelSpec,
)
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import InvalidTrainingSetupError, PipelineInputError, PretrainedWeightsError, TrainingFailedError
from tasks.launch.torchrun_launcher import build_torchrun_command, launch_training, worker_environment
from tasks.model.untrained import write_untrained_model_directory

DIRS = TrainingFolders(train_dir="/d/train", validation_dir="/d/val", model_spec_dir="/d/spec", output_dir="/d/model")


def test_single_node_command_is_standalone_torchrun_of_the_worker():
    command = build_torchrun_command(DIRS, params=TrainingParams(processes_per_node=2), python="py")
    assert command[:3] == ["py", "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "2"
    assert command[command.index("--nnodes") + 1] == "1"
    assert "--standalone" in command and "--rdzv-backend" not in command
    worker = command.index("-m", 3)
    assert command[worker + 1] == "tasks.training.worker"
    assert command[command.index("--output") + 1] == "/d/model"


def test_multi_node_command_uses_c10d_rendezvous():
    params = TrainingParams(nodes=2, rendezvous_endpoint="10.0.0.1:29400", max_restarts=3)
    command = build_torchrun_command(DIRS, params=params, run_id="run-7")
    assert "--standalone" not in command
    assert command[command.index("--rdzv-backend") + 1] == "c10d"
    assert command[command.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert command[command.index("--rdzv-id") + 1] == "run-7"
    assert command[command.index("--max-restarts") + 1] == "3"


def test_a_node_launched_through_the_pool_says_whether_it_serves_the_rendezvous():
    params = TrainingParams(nodes=2, rendezvous_endpoint="10.0.0.1:41234", join_timeout_s=90)
    conf = {is_host: build_torchrun_command(DIRS, params=params, is_host=is_host) for is_host in (True, False, None)}
    assert conf[True][conf[True].index("--rdzv-conf") + 1] == "join_timeout=90,is_host=1"
    assert conf[False][conf[False].index("--rdzv-conf") + 1] == "join_timeout=90,is_host=0"
    assert conf[None][conf[None].index("--rdzv-conf") + 1] == "join_timeout=90"


def test_multi_node_without_endpoint_is_refused_before_launch():
    with pytest.raises(PipelineInputError, match="rendezvous_endpoint"):
        build_torchrun_command(DIRS, params=TrainingParams(nodes=2))


def test_environment_shares_cpu_threads_and_makes_the_project_importable():
    env = worker_environment(TrainingParams(processes_per_node=2), base={"PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == str(max(1, (__import__("os").cpu_count() or 1) // 2))
    assert env["PYTHONUNBUFFERED"] == "1" and env["PYTHONPATH"]


def test_environment_keeps_freed_memory_unless_the_user_set_the_allocator():
    env = worker_environment(TrainingParams(), base={})
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) >= 2**20 and int(env["MALLOC_TRIM_THRESHOLD_"]) >= 2**20
    mine = worker_environment(TrainingParams(), base={"MALLOC_MMAP_THRESHOLD_": "131072"})
    assert mine["MALLOC_MMAP_THRESHOLD_"] == "131072" and "MALLOC_TRIM_THRESHOLD_" not in mine


@pytest.mark.integration
def test_staged_weights_changed_after_the_model_stage_are_refused_by_the_worker_not_retried(
    tmp_path, colour_image_dirs
):
    train, val = colour_image_dirs
    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    spec_dir = write_untrained_model_directory(tmp_path / "spec", ModelSpec(pretrained=True, weights_path=str(weights)))
    with open(spec_dir / STAGED_WEIGHTS_FILE, "ab") as staged:
        staged.write(b"changed on its way to the node")
    params = TrainingParams(epochs=1, processes_per_node=1, device="cpu")
    with pytest.raises(PretrainedWeightsError) as error:
        launch_training(TrainingFolders(train, val, spec_dir, tmp_path / "model"), params, log=lambda level, line: None)
    assert str(error.value).startswith(f"{spec_dir / STAGED_WEIGHTS_FILE} has sha256 ")
    assert "the staged file changed after the model stage checked it" in str(error.value)
    assert isinstance(error.value, PipelineInputError) and not isinstance(error.value, TrainingFailedError)


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_where_there_is_none_is_an_input_error(tmp_path, colour_image_dirs, resnet_spec):
    train, val = colour_image_dirs
    params = TrainingParams(epochs=1, processes_per_node=1, device="cuda")
    with pytest.raises(InvalidTrainingSetupError, match="device is 'cuda' but torch .* sees no CUDA device"):
        launch_training(
            TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
        )


@pytest.mark.integration
def test_failing_worker_raises_typed_error_with_rank_and_log_tail(tmp_path, colour_image_dirs, resnet_spec):
    train, val = (shutil.copytree(d, tmp_path / d.name) for d in colour_image_dirs)
    spec_dir = resnet_spec
    # A runtime failure, not a mistake in what the user gave: an image damaged after conversion.
    for image in sorted(train.rglob("*.png")):
        image.write_bytes(b"damaged after conversion")
    params = TrainingParams(epochs=1, processes_per_node=2)
    logged: list[tuple[int, str]] = []
    with pytest.raises(TrainingFailedError) as error:
        folders = TrainingFolders(train, val, spec_dir, tmp_path / "model")
        launch_training(folders, params, log=lambda level, line: logged.append((level, line)))
    failure = error.value
    assert failure.returncode != 0 and failure.rank in (0, 1)
    assert "TRAINING FAILED on rank" in failure.log_tail and "Traceback" in failure.log_tail
    assert str(failure).startswith(f"training failed on rank {failure.rank} first")
    assert f"driver_log_{failure.rank}.txt" in str(failure).splitlines()[0]
    lines = [line for _, line in logged]
    assert any("torch.distributed.run" in line for line in lines)
    # Each failing rank's traceback reaches the log once at ERROR (not at INFO, nor again from stderr);
    # torchrun's own closing traceback about the same failure stays at INFO.
    failed = [line for line in lines if "TRAINING FAILED on rank" in line]
    tracebacks = [level for level, line in logged if line.startswith("Traceback (most recent call last)")]
    assert failed and tracebacks.count(logging.ERROR) == len(failed)
    assert set(tracebacks) <= {logging.ERROR, logging.INFO} and len(tracebacks) <= len(failed) + 1
