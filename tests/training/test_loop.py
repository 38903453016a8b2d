"""tasks/training/loop.py: the optimiser, the schedule, early stopping."""

import torch

from tasks.contracts.model_directory import (
    EpochMetrics,
    TrainingMetrics,
)
from tasks.contracts.training_config import TrainingParams
from tasks.training.loop import make_optimizer, warmup_poly_schedule


def test_optimizer_is_fused_nesterov_sgd():
    model = torch.nn.Linear(4, 2)
    optimizer = make_optimizer(model, 0.1, TrainingParams(momentum=0.8, weight_decay=0.01))
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.1, 0.8, True, 0.01)
    assert group["fused"]


def test_warmup_then_polynomial_decay():
    factor = warmup_poly_schedule(warmup_steps=4, total_steps=12)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0 and factor(8) == 0.5 and factor(12) == 0.0


def epoch(n, val_loss, top1):
    return EpochMetrics(
        epoch=n,
        lr=0.1,
        train_images_per_s=1,
        train_loss=1,
        train_error=0.5,
        val_loss=val_loss,
        top1=top1,
        top5=1,
        seconds=1,
    )


def test_early_stopping_after_patience_epochs_without_lower_validation_loss():
    metrics = TrainingMetrics()
    bests = [
        metrics.add_epoch(epoch(n, loss, top1), patience=2, total_epochs=10)
        for n, loss, top1 in [(1, 0.9, 0.5), (2, 0.5, 0.7), (3, 0.6, 0.8), (4, 0.7, 0.6)]
    ]
    assert bests == [True, True, True, False]
    assert metrics.stopped_early and metrics.best_epoch == 3 and metrics.lowest_val_loss == 0.5
    last = TrainingMetrics()
    for n, loss in enumerate([0.5, 0.6, 0.7], start=1):
        last.add_epoch(epoch(n, loss, 0.5), patience=2, total_epochs=3)
    assert not last.stopped_early, "finishing on the last epoch is not stopping early"
