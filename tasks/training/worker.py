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
import json
import logging
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tasks.contracts.architectures import family_of, input_size
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import (
    CHECKPOINT_FILE,
    CLASSES_FILE,
    FAILURE_MARKER,
    LOGS_DIR,
    SPEC_FILE,
    WEIGHTS_FILE,
    EpochMetrics,
    ModelSpec,
    TrainedModelSpec,
    TrainingMetrics,
    driver_log_path,
    read_model_spec,
)
from tasks.contracts.training_config import TrainingParams, add_training_flags, params_from_flags
from tasks.memory import peak_rss_mb
from tasks.storage.local_files import write_text_atomic
from tasks.training.checkpoint import resume_or_start, save_checkpoint, saved_or_storage_fault
from tasks.training.data import TrainingData, check_same_classes
from tasks.training.distributed import (
    DistributedEnv,
    backend_name,
    choose_device,
    join_process_group,
    leave_process_group,
    share_buffers_of_rank_0,
)
from tasks.training.fine_tuning import freeze_backbone
from tasks.training.lifeline import Heartbeat, die_with_parent, output_lock, write_failure
from tasks.training.loop import (
    EpochContext,
    class_weights,
    compiled_model,
    evaluate,
    make_optimizer,
    train_one_epoch,
    uses_bf16,
    warmup_poly_schedule,
    write_training_log,
)
from tasks.vision.images import choose_image_size
from tasks.vision.networks import build_network, memory_format, split_head_and_backbone
from tasks.vision.weights import load_weights, staged_warm_start, staged_weights

# The parent of every training module's logger (loop, checkpoint, …): setup_logging sends it to the rank's file
# and, for rank 0, to the launcher.
logger = logging.getLogger("tasks.training")


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


def build_model(
    spec: ModelSpec, classes: int, spec_dir: str, params: TrainingParams, env: DistributedEnv, device: torch.device
) -> tuple[nn.Module, nn.Module, list[nn.Module]]:
    """(the network, what trains: its DistributedDataParallel wrapper when there is a group, the frozen modules)."""
    torch.manual_seed(params.random_seed)
    weights_file = staged_weights(spec_dir, spec)  # staged and hash-checked by the model stage: no download
    model = build_network(spec, classes, weights_file)
    if (started_from := staged_warm_start(spec_dir, spec)) is not None:  # a registered version's, head included
        load_weights(model, started_from, spec.architecture)
        logger.info("warm start: the weights of %s", spec.started_from.name)
    model = model.to(device, memory_format=memory_format(device))
    # Before DistributedDataParallel: it all-reduces the gradients of the parameters that require one when built.
    frozen = freeze_backbone(model, spec.architecture) if params.fine_tuning == "head" else []
    if frozen and weights_file is None:
        logger.warning("fine_tuning 'head' on a backbone that is not pretrained: the head learns from random features")
    if env.world_size == 1:
        return model, model, frozen
    return model, DistributedDataParallel(model, device_ids=[env.local_rank] if device.type == "cuda" else None), frozen


def log_plan(spec: TrainedModelSpec, model: nn.Module, data: TrainingData, ctx: EpochContext) -> None:
    params, train, val = ctx.params, data.train_set, data.val_set
    logger.info(
        "training %s on %d images (%d classes) at %d px, validating on %d; batch %d x %d processes; images decoded %s; "
        "decoded images kept in memory: %d of %d training, %d of %d validation",
        spec.architecture,
        len(train),
        spec.num_classes,
        spec.image_size,
        len(val),
        params.batch_size,
        ctx.world_size,
        data.decoded,
        train.cache_capacity,
        len(train),
        val.cache_capacity,
        len(val),
    )
    if data.labelled:
        logger.info("%s", data.labelled)
    head, backbone = split_head_and_backbone(model, spec.architecture)
    logger.info(
        "fine-tuning %s: head %s (%d parameters) at the learning rate, backbone (%d parameters) %s; %s",
        params.fine_tuning,
        family_of(spec.architecture).head,
        sum(p.numel() for p in head),
        sum(p.numel() for p in backbone),
        "frozen, in eval mode" if ctx.frozen else f"at {params.backbone_lr_factor:g} x the learning rate",
        "torch.compile: the network compiles at the first full batch" if ctx.compiled is not None else "eager",
    )


def run_epoch(ctx: EpochContext, model: nn.Module, data: TrainingData, classes: int, epoch: int) -> EpochMetrics:
    """Train one epoch and validate rank 0's weights on every rank; the epoch's figures, logged."""
    params = ctx.params
    # Seeding per epoch makes a resumed run draw the same batches and crops as an unbroken one.
    torch.manual_seed(params.random_seed + epoch)
    data.sampler.set_epoch(epoch)
    started = time.perf_counter()
    trained = train_one_epoch(ctx, data.train_loader, data.train_input, epoch)
    share_buffers_of_rank_0(model)
    validated = evaluate(ctx, model, data.val_loader, data.val_input, classes, epoch)
    record = EpochMetrics(
        epoch=epoch + 1, seconds=time.perf_counter() - started, **trained._asdict(), **validated._asdict()
    )
    logger.info(
        "epoch %d/%d train loss %.4f val loss %.4f top-1 %.4f top-5 %.4f (%.0f images/s, %.1f s)",
        record.epoch,
        params.epochs,
        record.train_loss,
        record.val_loss,
        record.top1,
        record.top5,
        record.train_images_per_s,
        record.seconds,
    )
    return record


def main(args: argparse.Namespace, heartbeat: Heartbeat) -> TrainingMetrics:
    params: TrainingParams = params_from_flags(args)
    env, output = DistributedEnv.from_environ(), Path(args.output)
    device = choose_device(env, params)
    join_process_group(env, device, params)
    logger.info(
        "rank %d/%d on %s (%s, %s, %s), restart %d, torch %s",
        env.rank,
        env.world_size,
        device,
        backend_name(),
        "bf16 autocast" if uses_bf16(device, params) else "fp32",
        "channels_last" if memory_format(device) == torch.channels_last else "contiguous",
        env.restart_count,
        torch.__version__,
    )

    train_dir, val_dir = ImageDirectory(args.train), ImageDirectory(args.validation)
    classes = check_same_classes(train_dir, val_dir)
    counts = [train_dir.manifest.counts.get(name, 0) for name in classes]
    spec = read_model_spec(args.model_spec)
    image_size = input_size(spec.architecture, params.image_size, choose_image_size(train_dir.median_side()))
    trained_spec = TrainedModelSpec(**spec.model_dump(), num_classes=len(classes), image_size=image_size)
    model, trains, frozen = build_model(spec, len(classes), args.model_spec, params, env, device)
    data = TrainingData.load(train_dir, val_dir, trained_spec, params, env, device)
    del train_dir, val_dir  # their manifests, a Python object per image: the datasets hold paths and labels
    optimizer = make_optimizer(model, params.learning_rate * env.world_size, params, spec.architecture)
    steps = len(data.train_loader)
    schedule = warmup_poly_schedule(params.warmup_epochs * steps, params.epochs * steps)
    ctx = EpochContext(
        model=trains,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
        criterion=nn.CrossEntropyLoss(weight=class_weights(counts, params, device)),
        device=device,
        params=params,
        heartbeat=heartbeat,
        world_size=env.world_size,
        frozen=tuple(frozen),
        compiled=compiled_model(trains, params),
    )
    metrics = resume_or_start(output, ctx, model, classes, env, steps)
    if env.is_main:
        write_text_atomic(output / SPEC_FILE, trained_spec.model_dump_json(indent=2))
        write_text_atomic(output / CLASSES_FILE, json.dumps(classes, indent=2))
    log_plan(trained_spec, model, data, ctx)
    if (weights := ctx.criterion.weight) is not None:
        shown = ", ".join(f"{name} {weight:.3g}" for name, weight in zip(classes, weights.tolist()))
        logger.info("class_weighting balanced: loss weights %s", shown)

    for epoch in range(len(metrics.epochs), params.epochs):
        if metrics.stopped_early:
            break
        record = run_epoch(ctx, model, data, len(classes), epoch)
        is_best = metrics.add_epoch(record, patience=params.patience, total_epochs=params.epochs)
        if metrics.stopped_early:
            logger.info("stopping early: validation loss has not decreased for %d epochs", params.patience)
        heartbeat.progress("save", epoch)
        if env.is_main:
            # Order matters: whoever sees epoch N in metrics.json can rely on its checkpoint being there.
            if is_best:
                saved_or_storage_fault(output / WEIGHTS_FILE, model.state_dict(), f"the epoch {epoch + 1} best weights")
            config = {"params": params.model_dump(), "spec": trained_spec.model_dump()}
            save_checkpoint(output / CHECKPOINT_FILE, model, optimizer, ctx.scheduler, metrics, classes, config)
            write_training_log(output, metrics)
    if env.is_main:
        # An attempt resumed from a checkpoint that holds every epoch (the earlier one stopped between its checkpoint
        # and its log) trains none: the log is written from the checkpoint's metrics all the same.
        write_training_log(output, metrics)

    logger.info("done: best top-1 %.4f at epoch %s", metrics.best_top1 or 0.0, metrics.best_epoch)
    gpu = f", GPU {torch.cuda.max_memory_allocated(device) / 2**20:.0f} MB" if device.type == "cuda" else ""
    logger.info("peak memory %.0f MB%s", peak_rss_mb(), gpu)
    leave_process_group()
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
        # Shared with this attempt's other ranks; a launcher starting another attempt waits for it (tasks/launch/torchrun_launcher.py).
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
