"""The resume state on its own: a checkpoint saved and restored into fresh objects, a checkpoint of other classes
refused, a full disk found behind torch's own error, the schedule rescaled for another world size."""

import pytest
import torch
from torch import nn

from tasks.contracts.model_directory import EpochMetrics, TrainingMetrics
from tasks.errors import InvalidDatasetError
from tasks.training.checkpoint import (
    read_checkpoint,
    rescale_schedule,
    restore_checkpoint,
    save_checkpoint,
    tensor_bytes,
)
from tasks.training.loop import warmup_poly_schedule


def training_state(seed: int):
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_poly_schedule(0, 100))
    return model, optimizer, scheduler


def test_a_saved_checkpoint_restores_weights_optimiser_schedule_and_metrics(tmp_path):
    model, optimizer, scheduler = training_state(0)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    metrics = TrainingMetrics(world_size=1)
    metrics.add_epoch(
        EpochMetrics(
            epoch=1,
            lr=0.1,
            train_images_per_s=1,
            train_loss=1,
            train_error=0.5,
            val_loss=1,
            top1=0.5,
            top5=1,
            seconds=1,
        ),
        patience=3,
        total_epochs=5,
    )
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint(path, model, optimizer, scheduler, metrics, ["a", "b", "c"], config={"k": 1})
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # written beside, then renamed: no .tmp

    fresh = training_state(1)
    restored = restore_checkpoint(read_checkpoint(path), path, *fresh, ["a", "b", "c"])
    assert restored == metrics
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh[0].state_dict().values()))
    assert fresh[2].last_epoch == 3 and fresh[1].state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()
    assert tensor_bytes(model.state_dict()) == (4 * 3 + 3) * 4

    with pytest.raises(
        InvalidDatasetError, match=r"trained on classes \['a', 'b', 'c'\], the data now has \['a', 'b'\]"
    ):
        restore_checkpoint(read_checkpoint(path), path, *training_state(2), ["a", "b"])
    assert read_checkpoint(tmp_path / "none.pt") is None and restore_checkpoint(None, path, *fresh, []) is None


def test_resuming_at_another_world_size_sets_the_rate_and_step_an_unbroken_run_would_have():
    _, optimizer, scheduler = training_state(0)
    lr = rescale_schedule(optimizer, scheduler, base_lr=0.4, step=25)
    assert lr == pytest.approx(0.4 * 0.75) and scheduler.last_epoch == 25 and scheduler.base_lrs == [0.4]
