"""tasks/training/loop.py: the optimiser, the schedule, early stopping."""

import pytest
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


@pytest.mark.slow  # inductor compiles C++ for the CPU first
def test_compiled_training_matches_eager_and_runs_the_last_smaller_batch_eagerly(tmp_path):
    """torch.compile (inductor, on the CPU here) trains the full batches to the eager result; the last batch of 3
    runs eagerly instead of compiling the network for a second shape (a recompile would raise here)."""
    import torch._dynamo

    from tasks.training.lifeline import Heartbeat
    from tasks.training.loop import EpochContext, compiled_model, train_one_epoch

    def trained(compile: str) -> tuple[float, torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.LazyLinear(4),
        )
        model(torch.zeros(2, 3, 8, 8))
        params = TrainingParams(batch_size=8, print_frequency=100, compile=compile)
        optimizer = make_optimizer(model, 0.05, params)
        ctx = EpochContext(
            model=model,
            optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
            criterion=torch.nn.CrossEntropyLoss(),
            device=torch.device("cpu"),
            params=params,
            heartbeat=Heartbeat(tmp_path, 0),  # not started: progress is only recorded
            world_size=1,
            compiled=compiled_model(model, params),
        )
        assert (ctx.compiled is None) == (compile == "off")
        generator = torch.Generator().manual_seed(1)
        batches = [
            (torch.randn(n, 3, 8, 8, generator=generator), torch.randint(0, 4, (n,), generator=generator))
            for n in (8, 8, 3)
        ]
        result = train_one_epoch(ctx, batches, lambda images: images, epoch=0)
        return result.train_loss, model[-1].weight.detach().clone()

    torch._dynamo.reset()
    eager_loss, eager_weights = trained("off")
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled_loss, compiled_weights = trained("on")
    assert abs(compiled_loss - eager_loss) < 1e-4 and torch.allclose(compiled_weights, eager_weights, atol=1e-4)


def test_balanced_class_weights_make_each_class_count_as_much():
    from tasks.training.loop import class_weights

    cpu = torch.device("cpu")
    assert class_weights([90, 10], TrainingParams(), cpu) is None, "none, the default"
    weights = class_weights([90, 10, 20], TrainingParams(class_weighting="balanced"), cpu)
    assert torch.allclose(weights, torch.tensor([120 / 270, 120 / 30, 120 / 60]))
    assert torch.allclose(weights * torch.tensor([90.0, 10.0, 20.0]), torch.full((3,), 40.0)), "equal totals"
