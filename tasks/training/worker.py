"""Train a torchvision classifier on an ImageDirectory with DistributedDataParallel.

Launched by the train stage, or by hand, through torchrun::

    # one machine, two processes (Gloo on CPU, NCCL on GPUs)
    python -m torch.distributed.run --standalone --nproc-per-node 2 -m tasks.training.worker \
        --train runs/demo/data/train --validation runs/demo/data/validation \
        --model-spec runs/demo/model_spec --output runs/demo/model --epochs 5

    # two machines: run on each, with the same endpoint and id
    python -m torch.distributed.run --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \
        --rdzv-endpoint host0:29400 --rdzv-id job42 -m tasks.training.worker ...

Rank 0 alone writes files, each atomically. A checkpoint is written after every epoch and
picked up on start (the newest any rank finds, sent to all: the hosts need not share a filesystem), so a
torchrun restart or a Prefect retry continues where the run stopped.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from tasks.architectures import family_of, input_size
from tasks.errors import InvalidDatasetError, InvalidTrainingSetupError
from tasks.fileio import write_text_atomic
from tasks.image_directory import ImageDirectory
from tasks.lifeline import Heartbeat, die_with_parent, output_lock, write_failure
from tasks.memory import peak_rss_mb
from tasks.model_directory import (
    CHECKPOINT_FILE,
    CLASSES_FILE,
    DIVERGED_MARKER,
    FAILURE_MARKER,
    LOGS_DIR,
    METRICS_FILE,
    SPEC_FILE,
    TRAINING_LOG_FILE,
    WEIGHTS_FILE,
    EpochMetrics,
    TrainedModelSpec,
    TrainingMetrics,
    driver_log_path,
    read_model_spec,
)
from tasks.training.batches import BatchesOfTwoOrMore
from tasks.training.checkpoint import (
    check_space_for_checkpoints,
    newest_checkpoint,
    read_checkpoint,
    rescale_schedule,
    restore_checkpoint,
    save_checkpoint,
    saved_or_storage_fault,
)
from tasks.training.config import TrainingParams, add_training_flags, params_from_flags
from tasks.training.fine_tuning import freeze_backbone, parameter_groups
from tasks.vision.images import ImageFiles, choose_image_size
from tasks.vision.networks import build_network, memory_format, split_head_and_backbone
from tasks.vision.transforms import eval_transform, train_transform
from tasks.vision.weights import staged_weights

logger = logging.getLogger("tasks.training.worker")


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # processes on this machine
    restart_count: int

    @classmethod
    def from_environ(cls) -> DistributedEnv:
        """torchrun's variables; a plain ``python -m`` start is a world of one."""
        return cls(
            rank=int(os.environ.get("RANK", 0)),
            world_size=int(os.environ.get("WORLD_SIZE", 1)),
            local_rank=int(os.environ.get("LOCAL_RANK", 0)),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
            restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", required=True, help="ImageDirectory with the labeled training images")
    parser.add_argument("--validation", required=True, help="ImageDirectory with the labeled validation images")
    parser.add_argument("--model-spec", required=True, help="UntrainedModelDirectory (model_spec.json)")
    parser.add_argument("--output", required=True, help="ModelDirectory to write (and resume from)")
    add_training_flags(parser)
    return parser


def setup_logging(output: Path, env: DistributedEnv) -> None:
    log_path = driver_log_path(output, env.rank)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_path, mode="a", encoding="utf-8")
    to_file.setFormatter(logging.Formatter(f"%(asctime)s [rank {env.rank}] %(levelname)s %(message)s"))
    # The launcher's logger stamps the time on what reaches it; every rank logs fully to its own file,
    # only rank 0 (and any rank's warnings) to the launcher.
    to_stdout = logging.StreamHandler(sys.stdout)
    to_stdout.setFormatter(logging.Formatter(f"[rank {env.rank}] %(levelname)s %(message)s"))
    to_stdout.setLevel(logging.INFO if env.is_main else logging.WARNING)
    for handler in (to_file, to_stdout):
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def warmup_poly_schedule(warmup_steps: int, total_steps: int, power: float = 1.0):
    """Linear warmup to the base rate, then polynomial decay towards zero at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return max(0.0, 1.0 - progress) ** power

    return factor


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor.tolist()


def uses_bf16(device: torch.device, params: TrainingParams) -> bool:
    """bf16 autocast on CUDA (tensor cores); CPU stays fp32, where bf16 measured slower here."""
    return params.precision == "bf16" or (params.precision == "auto" and device.type == "cuda")


def autocast(device: torch.device, params: TrainingParams):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(device, params))


def make_optimizer(
    model: nn.Module, learning_rate: float, params: TrainingParams, architecture: str | None = None
) -> torch.optim.SGD:
    """Nesterov SGD with the fused kernel: one pass over each parameter, its gradient and momentum instead of
    one per arithmetic step. On 2 CPU cores the default (foreach) step took 9-15 ms of a ResNet-18 batch at
    32 px and the fused one 4-5 ms (same update; `python -m bench.step`).

    With ``architecture`` (which says where the head is) the parameters are grouped by ``params.fine_tuning``
    and ``backbone_lr_factor`` (tasks/training/fine_tuning.py); without, every parameter is one group."""
    groups = parameter_groups(model, architecture, learning_rate, params) if architecture else list(model.parameters())
    options = dict(lr=learning_rate, momentum=params.momentum, nesterov=True, weight_decay=params.weight_decay)
    try:
        return torch.optim.SGD(groups, fused=True, **options)
    except (RuntimeError, TypeError, ValueError) as error:  # a torch build without the fused kernel for this device
        logger.info("fused SGD unavailable (%s); using the default implementation", error)
        return torch.optim.SGD(groups, **options)


def check_finite(loss_sum: torch.Tensor, epoch: int, step: int, params: TrainingParams, world_size: int) -> None:
    """Stop on a NaN or infinite loss before anything is saved: model.pt keeps the best finite epoch."""
    if not torch.isfinite(loss_sum):
        raise FloatingPointError(
            f"{DIVERGED_MARKER} lower the learning rate: the effective rate "
            f"{params.learning_rate * world_size:g} (learning_rate {params.learning_rate:g} x {world_size} processes) "
            f"made the training loss {loss_sum.item()} by epoch {epoch + 1}, batch {step}"
        )


def model_input(pixels: torch.Tensor, normalize, device: torch.device) -> torch.Tensor:
    """A uint8 batch from the loader, copied to the device and normalised there (a quarter of the bytes to copy)."""
    return normalize(pixels.to(device, non_blocking=True, memory_format=memory_format(device)))


# Slow batches (a large model on CPU) still log a progress line this often, whatever print_frequency says.
PROGRESS_SECONDS = 10.0


def train_one_epoch(
    model, loader, normalize, criterion, optimizer, scheduler, device, epoch, params, heartbeat, env, frozen=()
) -> tuple[float, float, float, float]:
    """One pass over ``loader`` (``env``: this rank's place in the group; ``frozen``: modules that stay in eval
    mode, the fixed backbone of head-only fine-tuning). Returns (mean training loss, training error, images/s
    across all ranks, learning rate the epoch started with)."""
    model.train()
    for module in frozen:
        module.eval()
    start_lr = optimizer.param_groups[0]["lr"]
    # Sums stay on the device: reading them (a sync) happens every print_frequency batches, not every batch.
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    seen = 0
    started = last_line = time.perf_counter()
    for step, (images, labels) in enumerate(loader, start=1):
        images = model_input(images, normalize, device)
        labels = labels.to(device, non_blocking=True)
        with autocast(device, params):
            logits = model(images)
            loss = criterion(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        loss_sum += loss.detach() * labels.size(0)
        correct += (logits.detach().argmax(dim=1) == labels).sum()
        seen += labels.size(0)
        heartbeat.at("train", epoch, step)
        if step % params.print_frequency == 0 or time.perf_counter() - last_line >= PROGRESS_SECONDS:
            last_line = time.perf_counter()
            check_finite(loss_sum, epoch, step, params, env.world_size)
            logger.info(
                "epoch %d/%d batch %d/%d loss %.4f lr %.6f",
                epoch + 1,
                params.epochs,
                step,
                len(loader),
                loss.item(),
                optimizer.param_groups[0]["lr"],
            )
    check_finite(loss_sum, epoch, len(loader), params, env.world_size)
    elapsed = time.perf_counter() - started
    total_loss, total_correct, total_seen = _all_reduce_sum([loss_sum.item(), correct.item(), seen], device)
    total_seen = max(1.0, total_seen)
    return total_loss / total_seen, 1.0 - total_correct / total_seen, total_seen / elapsed, start_lr


@torch.inference_mode()
def evaluate(
    model, loader, normalize, criterion, device, num_classes: int, params, heartbeat: Heartbeat, epoch: int
) -> tuple[float, float, float]:
    """(loss, top-1, top-5) over the whole validation set; each rank scores its own shard."""
    model.eval()
    k = min(5, num_classes)
    sums = [0.0, 0.0, 0.0, 0.0]  # loss, top-1 hits, top-k hits, images
    for step, (images, labels) in enumerate(loader, start=1):
        heartbeat.at("validate", epoch, step)
        images, labels = model_input(images, normalize, device), labels.to(device)
        with autocast(device, params):
            logits = model(images).float()
        top = logits.topk(k, dim=1).indices
        sums[0] += criterion(logits, labels).item() * labels.size(0)
        sums[1] += (top[:, 0] == labels).sum().item()
        sums[2] += (top == labels[:, None]).any(dim=1).sum().item()
        sums[3] += labels.size(0)
    loss, top1, topk, count = _all_reduce_sum(sums, device)
    return loss / count, top1 / count, topk / count


def write_training_log(output: Path, metrics: TrainingMetrics) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(EpochMetrics.model_fields))
    writer.writeheader()
    writer.writerows(epoch.model_dump() for epoch in metrics.epochs)
    write_text_atomic(output / TRAINING_LOG_FILE, buffer.getvalue())
    write_text_atomic(output / METRICS_FILE, metrics.model_dump_json(indent=2))


def check_gpus(processes_per_node: int, gpus: int) -> None:
    """One process per GPU: NCCL refuses two ranks on one device, deep inside its setup."""
    if gpus == 0:
        raise InvalidTrainingSetupError(
            f"device is 'cuda' but torch {torch.__version__} sees no CUDA device on this host: "
            "use device 'auto' or 'cpu', or run on a GPU worker"
        )
    if processes_per_node > gpus:
        raise InvalidTrainingSetupError(
            f"processes_per_node is {processes_per_node} but this host has {gpus} CUDA device(s): use at most "
            f"one process per GPU (processes_per_node={gpus})"
        )


def main(args: argparse.Namespace, heartbeat: Heartbeat) -> TrainingMetrics:
    params: TrainingParams = params_from_flags(args)
    env = DistributedEnv.from_environ()
    output = Path(args.output)

    use_cuda = params.device == "cuda" or (params.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        check_gpus(env.local_world_size, torch.cuda.device_count())
        torch.cuda.set_device(env.local_rank)
        device = torch.device("cuda", env.local_rank)
        # Input sizes are fixed, so cuDNN's per-shape algorithm search pays for itself after one batch.
        torch.backends.cudnn.benchmark = True
    else:
        device = torch.device("cpu")
    if env.world_size > 1:
        store, _, _ = next(dist.rendezvous("env://"))
        # After a restart torchrun can hand the new worker group the store the failed group used; without a
        # per-restart prefix the new ranks may read the dead ranks' addresses and fail to connect.
        store = dist.PrefixStore(f"restart-{env.restart_count}", store)
        # A collective that waits longer than this fails instead of hanging for torch's default 10-30 minutes.
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            store=store,
            rank=env.rank,
            world_size=env.world_size,
            timeout=datetime.timedelta(seconds=params.collective_timeout_s),
        )
    logger.info(
        "rank %d/%d on %s (%s, %s, %s), restart %d, torch %s",
        env.rank,
        env.world_size,
        device,
        dist.get_backend() if dist.is_initialized() else "single process",
        "bf16 autocast" if uses_bf16(device, params) else "fp32",
        "channels_last" if memory_format(device) == torch.channels_last else "contiguous",
        env.restart_count,
        torch.__version__,
    )

    train_dir, val_dir = ImageDirectory(args.train), ImageDirectory(args.validation)
    if train_dir.classes != val_dir.classes:
        raise InvalidDatasetError(f"train classes {train_dir.classes} differ from validation {val_dir.classes}")
    classes = train_dir.classes
    spec = read_model_spec(args.model_spec)
    image_size = input_size(spec.architecture, params.image_size, choose_image_size(train_dir.median_side()))
    trained_spec = TrainedModelSpec(**spec.model_dump(), num_classes=len(classes), image_size=image_size)

    torch.manual_seed(params.random_seed)
    weights_file = staged_weights(args.model_spec, spec)  # staged and hash-checked by the model stage: no download
    model = build_network(spec, len(classes), weights_file).to(device, memory_format=memory_format(device))
    # Before DistributedDataParallel: it all-reduces the gradients of the parameters that require one when built.
    frozen = freeze_backbone(model, spec.architecture) if params.fine_tuning == "head" else []
    if frozen and weights_file is None:
        logger.warning("fine_tuning 'head' on a backbone that is not pretrained: the head learns from random features")
    ddp_model = (
        DistributedDataParallel(model, device_ids=[env.local_rank] if use_cuda else None)
        if dist.is_initialized()
        else model
    )

    workers = params.data_workers
    if workers is None:
        # On CPU the compute threads already use every core: loader processes would only compete with them
        # (measured 0.70x of a plain in-process loop with one loader worker on 2 cores). On GPU the CPUs are
        # free to decode ahead of the device.
        workers = min(8, max(1, (os.cpu_count() or 1) // env.local_world_size - 1)) if use_cuda else 0
    # Loader processes would each fill a cache of their own: the decoded-image cache is for in-process loading.
    # The budget is per machine, shared out between its processes (each caches every image it is dealt).
    cache_bytes = params.image_cache_mb * 2**20 // env.local_world_size if workers == 0 else 0
    transforms = (spec.transformations, image_size, trained_spec.mean, trained_spec.std)
    train_set = ImageFiles(train_dir.samples(), train_transform(*transforms), cache_bytes, normalized=False)
    val_set = ImageFiles(
        val_dir.samples(), eval_transform(*transforms), cache_bytes - train_set.cache_bytes, normalized=False
    )
    sampler = DistributedSampler(
        train_set, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=params.random_seed
    )
    loader_options = {"num_workers": workers, "pin_memory": use_cuda, "persistent_workers": workers > 0}
    train_loader = DataLoader(train_set, batch_sampler=BatchesOfTwoOrMore(sampler, params.batch_size), **loader_options)
    # A strided shard per rank covers every validation image exactly once (DistributedSampler would pad).
    val_shard = Subset(val_set, range(env.rank, len(val_set), env.world_size))
    val_loader = DataLoader(val_shard, batch_size=params.batch_size * 2, **loader_options)

    criterion = nn.CrossEntropyLoss()
    optimizer = make_optimizer(model, params.learning_rate * env.world_size, params, spec.architecture)
    steps = len(train_loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_poly_schedule(params.warmup_epochs * steps, params.epochs * steps)
    )

    checkpoint_path = output / CHECKPOINT_FILE
    if env.is_main:
        check_space_for_checkpoints(output, model)
    state = newest_checkpoint(read_checkpoint(checkpoint_path))
    metrics = restore_checkpoint(state, checkpoint_path, model, optimizer, scheduler, classes)
    if metrics is None:
        metrics = TrainingMetrics(world_size=env.world_size)
    else:
        logger.info("resuming from %s after epoch %d", checkpoint_path, len(metrics.epochs))
    start_epoch = len(metrics.epochs)
    if metrics.world_size != env.world_size:
        # Another number of processes (an elastic rescale, a retry on other hosts): the rate scales with the world
        # size and an epoch has another number of batches, so the checkpoint's rate and step would be wrong.
        lr = rescale_schedule(optimizer, scheduler, params.learning_rate * env.world_size, start_epoch * steps)
        logger.info(
            "world size %d (the checkpoint's was %d): learning rate %g (base %g = %g x %d), at step %d of %d",
            env.world_size,
            metrics.world_size,
            lr,
            params.learning_rate * env.world_size,
            params.learning_rate,
            env.world_size,
            start_epoch * steps,
            params.epochs * steps,
        )
        metrics.world_size = env.world_size

    if env.is_main:
        write_text_atomic(output / SPEC_FILE, trained_spec.model_dump_json(indent=2))
        write_text_atomic(output / CLASSES_FILE, json.dumps(classes, indent=2))
    logger.info(
        "training %s on %d images (%d classes) at %d px, validating on %d; batch %d x %d processes, %d loader workers; "
        "decoded images kept in memory: %d of %d training, %d of %d validation",
        spec.architecture,
        len(train_set),
        len(classes),
        image_size,
        len(val_set),
        params.batch_size,
        env.world_size,
        workers,
        train_set.cache_capacity,
        len(train_set),
        val_set.cache_capacity,
        len(val_set),
    )
    head, backbone = split_head_and_backbone(model, spec.architecture)
    logger.info(
        "fine-tuning %s: head %s (%d parameters) at the learning rate, backbone (%d parameters) %s",
        params.fine_tuning,
        family_of(spec.architecture).head,
        sum(p.numel() for p in head),
        sum(p.numel() for p in backbone),
        "frozen, in eval mode" if frozen else f"at {params.backbone_lr_factor:g} x the learning rate",
    )

    for epoch in range(start_epoch, params.epochs):
        if metrics.stopped_early:
            break
        # Seeding per epoch makes a resumed run draw the same batches and crops as an unbroken one.
        torch.manual_seed(params.random_seed + epoch)
        sampler.set_epoch(epoch)
        started = time.perf_counter()
        normalize = train_set.transform.normalize
        train_loss, train_error, images_per_s, lr = train_one_epoch(
            ddp_model,
            train_loader,
            normalize,
            criterion,
            optimizer,
            scheduler,
            device,
            epoch,
            params,
            heartbeat,
            env,
            frozen,
        )
        if dist.is_initialized():
            # Each rank's last forward pass moved its own BatchNorm statistics: evaluate (and save)
            # rank 0's on every rank, so the figures describe exactly the weights written to model.pt.
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)
        val_loss, top1, top5 = evaluate(
            model, val_loader, val_set.transform.normalize, criterion, device, len(classes), params, heartbeat, epoch
        )
        record = EpochMetrics(
            epoch=epoch + 1,
            lr=lr,
            train_images_per_s=images_per_s,
            train_loss=train_loss,
            train_error=train_error,
            val_loss=val_loss,
            top1=top1,
            top5=top5,
            seconds=time.perf_counter() - started,
        )
        logger.info(
            "epoch %d/%d train loss %.4f val loss %.4f top-1 %.4f top-5 %.4f (%.0f images/s, %.1f s)",
            record.epoch,
            params.epochs,
            train_loss,
            val_loss,
            top1,
            top5,
            images_per_s,
            record.seconds,
        )

        is_best = metrics.add_epoch(record, patience=params.patience, total_epochs=params.epochs)
        if metrics.stopped_early:
            logger.info("stopping early: validation loss has not decreased for %d epochs", params.patience)
        heartbeat.at("save", epoch)
        if env.is_main:
            # Order matters: whoever sees epoch N in metrics.json can rely on its checkpoint being there.
            if is_best:
                saved_or_storage_fault(output / WEIGHTS_FILE, model.state_dict(), f"the epoch {epoch + 1} best weights")
            save_checkpoint(
                checkpoint_path,
                model,
                optimizer,
                scheduler,
                metrics,
                classes,
                config={"params": params.model_dump(), "spec": trained_spec.model_dump()},
            )
            write_training_log(output, metrics)

    logger.info("done: best top-1 %.4f at epoch %s", metrics.best_top1 or 0.0, metrics.best_epoch)
    logger.info(
        "peak memory %.0f MB%s",
        peak_rss_mb(),
        f", GPU {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MB" if use_cuda else "",
    )
    if dist.is_initialized():
        # Nobody leaves before rank 0 has written the last files.
        dist.barrier()
        dist.destroy_process_group()
    return metrics


def run() -> None:
    # torchrun gives each worker a session of its own: without this, killing torchrun leaves the worker training.
    die_with_parent()
    args = get_args_parser().parse_args()
    env = DistributedEnv.from_environ()
    output = Path(args.output)
    setup_logging(output, env)
    log_dir = output / LOGS_DIR
    heartbeat = Heartbeat(log_dir, env.rank).start()
    try:
        # Shared with this attempt's other ranks; a launcher starting another attempt waits for it (tasks/launch.py).
        with output_lock(log_dir, shared=True):
            main(args, heartbeat)
    except BaseException as error:
        heartbeat.stop("failed")
        logger.exception("%s %d", FAILURE_MARKER, env.rank)
        write_failure(log_dir, env.rank, error)
        # Logged once above, with its level; re-raising would print the traceback a second time.
        raise SystemExit(1) from None
    heartbeat.stop()


if __name__ == "__main__":
    run()
