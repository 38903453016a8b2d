"""The training loop: the optimiser and its schedule, one epoch, the validation pass, the finite-loss check.
``EpochContext`` holds what every epoch uses; the worker (tasks/training/worker.py) builds it once."""

from __future__ import annotations

import csv
import io
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from tasks.contracts.model_directory import (
    DIVERGED_MARKER,
    METRICS_FILE,
    TRAINING_LOG_FILE,
    EpochMetrics,
    TrainingMetrics,
)
from tasks.contracts.training_config import TrainingParams
from tasks.storage.local_files import write_text_atomic
from tasks.training.distributed import all_reduce_sum
from tasks.training.fine_tuning import parameter_groups
from tasks.training.lifeline import Heartbeat

logger = logging.getLogger(__name__)

# Slow batches (a large model on CPU) still log a progress line this often, whatever print_frequency says.
PROGRESS_SECONDS = 10.0


def warmup_poly_schedule(warmup_steps: int, total_steps: int, power: float = 1.0):
    """Linear warmup to the base rate, then polynomial decay towards zero at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return max(0.0, 1.0 - progress) ** power

    return factor


def uses_bf16(device: torch.device, params: TrainingParams) -> bool:
    """bf16 autocast on CUDA (tensor cores); CPU stays fp32, where bf16 measured slower here."""
    return params.precision == "bf16" or (params.precision == "auto" and device.type == "cuda")


def autocast(device: torch.device, params: TrainingParams):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(device, params))


def make_optimizer(
    model: nn.Module, learning_rate: float, params: TrainingParams, architecture: str | None = None
) -> torch.optim.SGD:
    """Nesterov SGD with the fused kernel: one pass over each parameter, its gradient and momentum instead of
    one per arithmetic step: the same update, in less than half the time on CPU (`python -m bench.step`).

    With ``architecture`` (which says where the head is) the parameters are grouped by ``params.fine_tuning``
    and ``backbone_lr_factor`` (tasks/training/fine_tuning.py); without, every parameter is one group."""
    groups = parameter_groups(model, architecture, learning_rate, params) if architecture else list(model.parameters())
    options = dict(lr=learning_rate, momentum=params.momentum, nesterov=True, weight_decay=params.weight_decay)
    try:
        return torch.optim.SGD(groups, fused=True, **options)
    except (RuntimeError, TypeError, ValueError) as error:  # a torch build without the fused kernel for this device
        logger.info("fused SGD unavailable (%s); using the default implementation", error)
        return torch.optim.SGD(groups, **options)


def class_weights(counts: Sequence[int], params: TrainingParams, device: torch.device) -> torch.Tensor | None:
    """The loss's per-class weights for ``params.class_weighting`` from the training images' class counts (in class
    order): None for "none"; for "balanced", scikit-learn's ``n_images / (n_classes x count)``."""
    if params.class_weighting == "none":
        return None
    from sklearn.utils.class_weight import compute_class_weight

    labels = np.repeat(np.arange(len(counts)), counts)
    weights = compute_class_weight("balanced", classes=np.arange(len(counts)), y=labels)
    return torch.tensor(weights, dtype=torch.float32, device=device)


def check_finite(loss_sum: torch.Tensor, epoch: int, step: int, params: TrainingParams, world_size: int) -> None:
    """Stop on a NaN or infinite loss before anything is saved: model.pt keeps the best finite epoch."""
    if not torch.isfinite(loss_sum):
        raise FloatingPointError(
            f"{DIVERGED_MARKER} lower the learning rate: the effective rate "
            f"{params.learning_rate * world_size:g} (learning_rate {params.learning_rate:g} x {world_size} processes) "
            f"made the training loss {loss_sum.item()} by epoch {epoch + 1}, batch {step}"
        )


@dataclass(frozen=True)
class EpochContext:
    """What every epoch of one rank uses. ``model`` is what trains (the DistributedDataParallel wrapper when there
    is a group); ``frozen``: modules that stay in eval mode, the fixed backbone of head-only fine-tuning."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    criterion: nn.Module
    device: torch.device
    params: TrainingParams
    heartbeat: Heartbeat
    world_size: int
    frozen: Sequence[nn.Module] = field(default_factory=tuple)
    compiled: nn.Module | None = None  # ``model`` through torch.compile (``compiled_model``), for full batches


def compiled_model(model: nn.Module, params: TrainingParams) -> nn.Module | None:
    """``model`` (the DistributedDataParallel wrapper when there is one: torch.compile then splits the graph at its
    gradient buckets) through torch.compile when ``params.compile`` is on, else None. Shapes are static: the last,
    smaller batch of an epoch runs eagerly rather than compiling the network a second time."""
    return torch.compile(model, dynamic=False) if params.compile == "on" else None


class Trained(NamedTuple):
    """An epoch's training figures (named as in EpochMetrics)."""

    train_loss: float  # mean over every rank's images
    train_error: float
    train_images_per_s: float  # across all ranks
    lr: float  # the learning rate the epoch started with


class Validated(NamedTuple):
    """The validation figures of an epoch (named as in EpochMetrics)."""

    val_loss: float
    top1: float
    top5: float  # top-k with k = min(5, classes)


def train_one_epoch(
    ctx: EpochContext, loader: Iterable, model_input: Callable[[object], torch.Tensor], epoch: int
) -> Trained:
    """One pass over ``loader`` (``model_input`` turns its images into the network's input on the device): its
    training figures across all ranks."""
    model, optimizer, params, device = ctx.model, ctx.optimizer, ctx.params, ctx.device
    model.train()
    for module in ctx.frozen:
        module.eval()
    start_lr = optimizer.param_groups[0]["lr"]
    # Sums stay on the device: reading them (a sync) happens every print_frequency batches, not every batch.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen = 0
    started = last_line = time.perf_counter()
    for step, (images, labels) in enumerate(loader, start=1):
        images = model_input(images)
        labels = labels.to(device, non_blocking=True)
        full = ctx.compiled is not None and labels.size(0) == params.batch_size
        with autocast(device, params):
            logits = (ctx.compiled if full else model)(images)
            loss = ctx.criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ctx.scheduler.step()
        loss_sum += loss.detach() * labels.size(0)
        correct += (logits.detach().argmax(dim=1) == labels).sum()
        seen += labels.size(0)
        ctx.heartbeat.progress("train", epoch, step)
        if step % params.print_frequency == 0 or time.perf_counter() - last_line >= PROGRESS_SECONDS:
            last_line = time.perf_counter()
            check_finite(loss_sum, epoch, step, params, ctx.world_size)
            logger.info(
                "epoch %d/%d batch %d/%d loss %.4f lr %.6f",
                epoch + 1,
                params.epochs,
                step,
                len(loader),
                loss.item(),
                optimizer.param_groups[0]["lr"],
            )
    check_finite(loss_sum, epoch, len(loader), params, ctx.world_size)
    elapsed = time.perf_counter() - started
    total_loss, total_correct, total_seen = all_reduce_sum([loss_sum.item(), correct.item(), seen], device)
    total_seen = max(1.0, total_seen)
    return Trained(total_loss / total_seen, 1.0 - total_correct / total_seen, total_seen / elapsed, start_lr)


@torch.inference_mode()
def evaluate(
    ctx: EpochContext, model: nn.Module, loader: Iterable, model_input, num_classes: int, epoch: int
) -> Validated:
    """Loss, top-1 and top-5 of ``model`` (the bare network: no gradients to share) over the whole validation set;
    each rank scores its own shard."""
    model.eval()
    k = min(5, num_classes)
    sums = [0.0, 0.0, 0.0, 0.0]  # loss, top-1 hits, top-k hits, images
    for step, (images, labels) in enumerate(loader, start=1):
        ctx.heartbeat.progress("validate", epoch, step)
        images, labels = model_input(images), labels.to(ctx.device)
        with autocast(ctx.device, ctx.params):
            logits = model(images).float()
        top = logits.topk(k, dim=1).indices
        sums[0] += ctx.criterion(logits, labels).item() * labels.size(0)
        sums[1] += (top[:, 0] == labels).sum().item()
        sums[2] += (top == labels[:, None]).any(dim=1).sum().item()
        sums[3] += labels.size(0)
    loss, top1, topk, count = all_reduce_sum(sums, ctx.device)
    return Validated(loss / count, top1 / count, topk / count)


def write_training_log(output: Path, metrics: TrainingMetrics) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(EpochMetrics.model_fields))
    writer.writeheader()
    writer.writerows(epoch.model_dump() for epoch in metrics.epochs)
    write_text_atomic(output / TRAINING_LOG_FILE, buffer.getvalue())
    write_text_atomic(output / METRICS_FILE, metrics.model_dump_json(indent=2))
