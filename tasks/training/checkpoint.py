"""The resume state of the training worker: written by rank 0 after every epoch, the newest copy restored on every rank on start."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from tasks.contracts.model_directory import CHECKPOINT_FILE, TrainingMetrics
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import atomic_write, require_space, storage_faults

if TYPE_CHECKING:
    from torch import nn

    from tasks.training.distributed import DistributedEnv
    from tasks.training.loop import EpochContext

logger = logging.getLogger(__name__)


def tensor_bytes(state) -> int:
    """The bytes of every tensor in a (nested) state dict: about what ``torch.save`` writes."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(value) for value in state)
    return 0


def saved_or_storage_fault(path: Path, state, what: str) -> None:
    """``torch.save(state)`` to ``path`` atomically; a full or failing disk raises OutputStorageError whose first
    line says so (needed and free space): a retry cannot help until space is freed."""
    with storage_faults(f"{what} to {path}", tensor_bytes(state)), atomic_write(path, "wb") as handle:
        torch.save(state, handle)


def check_space_for_checkpoints(output: Path, model) -> None:
    """Refuse before the first epoch when ``output`` cannot hold what training writes: two checkpoints (the new
    one is written beside the old, then replaces it), each the weights and SGD's momentum of the same size, and the
    best weights (model.pt)."""
    weights = tensor_bytes(model.state_dict())
    why = "two checkpoints of weights and optimizer state, and the best weights"
    require_space(output, 2 * (2 * weights) + weights, "training's checkpoints", why, "work_dir")


def save_checkpoint(path: Path, model, optimizer, scheduler, metrics: TrainingMetrics, classes, config) -> None:
    """Everything a restarted worker needs to continue: weights, optimizer and schedule, metrics so far."""
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "epoch": len(metrics.epochs),
        "metrics": metrics.model_dump(),
        "classes": classes,
        "config": config,
    }
    saved_or_storage_fault(path, state, f"the epoch {state['epoch']} checkpoint")


def read_checkpoint(path: Path) -> dict | None:
    """A checkpoint's state, None when there is none."""
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)


def newest_checkpoint(state: dict | None) -> dict | None:
    """The newest of every rank's checkpoint, on every rank. Hosts need not share a filesystem (work_dir on S3):
    after an elastic restart rank 0 may run on a host whose copy is older than another host's."""
    if not dist.is_initialized():
        return state
    epochs: list = [None] * dist.get_world_size()
    dist.all_gather_object(epochs, -1 if state is None else state["epoch"])
    newest = [state]
    dist.broadcast_object_list(newest, src=max(range(len(epochs)), key=lambda rank: (epochs[rank], -rank)))
    return newest[0]


def restore_checkpoint(state: dict | None, path: Path, model, optimizer, scheduler, classes) -> TrainingMetrics | None:
    """Restore a checkpoint's state into the model, optimizer and scheduler; None when there is none."""
    if state is None:
        return None
    if state["classes"] != classes:
        raise InvalidDatasetError(
            f"{path} was trained on classes {state['classes']}, the data now has {classes}: use a new output directory"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return TrainingMetrics.model_validate(state["metrics"])


def rescale_schedule(optimizer, scheduler, base_lr: float, step: int) -> float:
    """Resuming at another world size: the base rate (learning_rate x world size) and the schedule's position
    (epochs done x this world size's batches per epoch) that an unbroken run at this size would have, instead of
    the checkpoint's. A parameter group with an ``lr_factor`` (the backbone's, tasks/training/fine_tuning.py) keeps
    it. Returns the learning rate the next batch uses in the first group (the head's, the one logged)."""
    scheduler.base_lrs = [base_lr * group.get("lr_factor", 1.0) for group in optimizer.param_groups]
    scheduler.last_epoch = step
    for group, base, factor in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["initial_lr"], group["lr"] = base, base * factor(step)
    return optimizer.param_groups[0]["lr"]


def resume_or_start(
    output: Path, ctx: EpochContext, model: nn.Module, classes: list[str], env: DistributedEnv, steps: int
) -> TrainingMetrics:
    """The metrics so far: from the newest checkpoint any rank holds (weights, optimiser and schedule restored), or
    new. A checkpoint of another world size gets the learning rate and step of this one."""
    checkpoint_path, params = output / CHECKPOINT_FILE, ctx.params
    if env.is_main:
        check_space_for_checkpoints(output, model)
    state = newest_checkpoint(read_checkpoint(checkpoint_path))
    metrics = restore_checkpoint(state, checkpoint_path, model, ctx.optimizer, ctx.scheduler, classes)
    if metrics is None:
        return TrainingMetrics(world_size=env.world_size)
    logger.info("resuming from %s after epoch %d", checkpoint_path, len(metrics.epochs))
    if metrics.world_size != env.world_size:
        # Another number of processes (an elastic rescale, a retry on other hosts): the rate scales with the world
        # size and an epoch has another number of batches, so the checkpoint's rate and step would be wrong.
        done = len(metrics.epochs) * steps
        lr = rescale_schedule(ctx.optimizer, ctx.scheduler, params.learning_rate * env.world_size, done)
        logger.info(
            "world size %d (the checkpoint's was %d): learning rate %g (base %g = %g x %d), at step %d of %d",
            env.world_size,
            metrics.world_size,
            lr,
            params.learning_rate * env.world_size,
            params.learning_rate,
            env.world_size,
            done,
            params.epochs * steps,
        )
        metrics.world_size = env.world_size
    return metrics
