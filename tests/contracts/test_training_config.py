"""tasks/contracts/training_config.py: TrainingParams' defaults (Azure's component) and the worker's flags."""

import pytest

from tasks.contracts.training_config import TrainingFolders, TrainingParams, params_from_flags
from tasks.launch.torchrun_launcher import build_torchrun_command
from tasks.training.worker import get_args_parser


def test_worker_flags_round_trip_to_the_same_params():
    params = TrainingParams(epochs=7, learning_rate=0.05, image_size=48, device="cpu", processes_per_node=2)
    folders = TrainingFolders("/d/train", "/d/val", "/d/spec", "/d/model")
    command = build_torchrun_command(folders, params=params)
    args = get_args_parser().parse_args(command[command.index("tasks.training.worker") + 1 :])
    assert params_from_flags(args) == params


def test_defaults_are_the_azure_components():
    p = TrainingParams()
    assert (
        p.epochs,
        p.batch_size,
        p.warmup_epochs,
        p.learning_rate,
        p.random_seed,
        p.patience,
        p.print_frequency,
        p.nodes,
        p.processes_per_node,
    ) == (5, 16, 0, 0.001, 1, 3, 10, 1, 1)
    with pytest.raises(ValueError):
        TrainingParams(epochs=0)
