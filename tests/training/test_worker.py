"""The worker's epoch loop on its own (one process, CPU, a tiny linear model): no torchrun needed."""

import logging

import torch
from torch import nn

from tasks.lifeline import Heartbeat
from tasks.training import loop, worker
from tasks.training.config import TrainingParams


def run_epoch(tmp_path, params: TrainingParams, batches: int = 6) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    loader = [(torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8), torch.tensor([0, 1])) for _ in range(batches)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    heartbeat = Heartbeat(tmp_path, 0)  # not started: the loop only records its progress in it
    normalize = lambda pixels: pixels.float() / 255  # noqa: E731
    ctx = loop.EpochContext(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        criterion=nn.CrossEntropyLoss(),
        device=torch.device("cpu"),
        params=params,
        heartbeat=heartbeat,
        world_size=1,
    )
    loop.train_one_epoch(ctx, loader, normalize, 0)


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 1/1 batch")]


def test_an_epoch_logs_every_print_frequency_batches(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger=worker.logger.name):
        run_epoch(tmp_path, TrainingParams(epochs=1, print_frequency=3))
    assert [line.split(" loss")[0] for line in progress_lines(caplog)] == ["epoch 1/1 batch 3/6", "epoch 1/1 batch 6/6"]


def test_slow_batches_still_log_a_line_every_progress_interval(tmp_path, caplog, monkeypatch):
    # Every batch "slower" than the interval: each gets a line although print_frequency would give none.
    monkeypatch.setattr(loop, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger=worker.logger.name):
        run_epoch(tmp_path, TrainingParams(epochs=1, print_frequency=1000))
    assert len(progress_lines(caplog)) == 6
