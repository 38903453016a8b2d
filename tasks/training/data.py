"""What one rank trains and validates on: the two ImageDirectories as datasets, the seeded shard sampler, the
loaders, and the decoded-image cache's share of memory."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Subset

from tasks.contracts.image_directory import ImageDirectory, ImageSamples
from tasks.contracts.model_directory import TrainedModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.errors import InvalidDatasetError
from tasks.training.batches import BatchesOfTwoOrMore
from tasks.training.distributed import DistributedEnv
from tasks.vision.device_pipeline import DecodedAhead, DevicePipeline
from tasks.vision.images import ImageFiles
from tasks.vision.networks import memory_format
from tasks.vision.payloads import EncodedImageFiles, collate_payloads
from tasks.vision.transforms import eval_transform, train_transform

ModelInput = Callable[[object], torch.Tensor]  # a loader's batch of images -> the network's input on the device


def check_same_classes(train: ImageDirectory, validation: ImageDirectory) -> list[str]:
    if train.classes != validation.classes:
        raise InvalidDatasetError(f"train classes {train.classes} differ from validation {validation.classes}")
    return train.classes


def loader_workers(params: TrainingParams, env: DistributedEnv, device: torch.device) -> int:
    """``params.data_workers``, or: none on CPU, where the compute threads already use every core (loader
    processes only compete with them); on
    GPU the CPUs are free to decode ahead of the device."""
    if params.data_workers is not None:
        return params.data_workers
    return min(8, max(1, (os.cpu_count() or 1) // env.local_world_size - 1)) if device.type == "cuda" else 0


def uint8_to_device(normalize: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> ModelInput:
    """A uint8 batch from the loader, copied to the device and normalised there (a quarter of the bytes to copy)."""
    return lambda pixels: normalize(pixels.to(device, non_blocking=True, memory_format=memory_format(device)))


def on_device(pipeline: DevicePipeline, training: bool, device: torch.device) -> ModelInput:
    """A batch decoded on the device (``DecodedAhead``), augmented when ``training`` and normalised there."""
    return lambda images: pipeline.finish(images, training).contiguous(memory_format=memory_format(device))


def drawn_rows(train: ImageDirectory, labelled_share: float) -> np.ndarray | None:
    """The rows an epoch draws when the labelled batches' images (``ImageDirectory.labelled_rows``) are to make at
    least ``labelled_share`` of the draws: every row once and those images a whole number of times more, the
    nearest to the share; None when every row is drawn once (no labelled images, a share of 0, or reached)."""
    labelled = train.labelled_rows()
    others = len(train) - len(labelled)
    if not len(labelled) or not others or len(labelled) >= labelled_share * len(train):
        return None
    times = max(1, round(labelled_share * others / ((1 - labelled_share) * len(labelled))))
    return np.concatenate([np.arange(len(train)), np.repeat(labelled, times - 1)]) if times > 1 else None


def labelled_draws(rows: np.ndarray, images: int) -> str:
    """What ``drawn_rows`` made of ``images`` rows, for the log."""
    labelled = len(np.unique(rows[images:]))
    share = (len(rows) - images + labelled) / len(rows)  # each labelled row once, and its repeats
    return (
        f"{labelled:,} images of labelled batches drawn {(len(rows) - images) // labelled + 1} times an epoch: "
        f"{share:.0%} of its {len(rows):,} draws (labelled_share)"
    )


JPEG_SUFFIXES = (".jpg", ".jpeg")


def where_to_decode(params: TrainingParams, samples: ImageSamples, device: torch.device) -> str:
    """``params.decode_on``, with "auto" settled: the device when it is CUDA and most training images are JPEGs
    (judged from up to 256 of them, spread over the list), else the loader's processes, whose decoded-image cache
    serves other formats better than decoding them again every epoch."""
    if params.decode_on != "auto":
        return params.decode_on
    if device.type != "cuda" or not len(samples):
        return "cpu"
    looked_at = range(0, len(samples), -(-len(samples) // 256))  # at most 256, spread evenly
    jpegs = sum(str(samples[i][0]).lower().endswith(JPEG_SUFFIXES) for i in looked_at)
    return "device" if jpegs * 2 > len(looked_at) else "cpu"


@dataclass
class TrainingData:
    """The loaders, and how each one's batches become the network's input (``train_input``, ``val_input``)."""

    train_set: ImageFiles | EncodedImageFiles
    val_set: ImageFiles | EncodedImageFiles
    sampler: DistributedSampler
    train_loader: DataLoader | DecodedAhead
    val_loader: DataLoader | DecodedAhead
    train_input: ModelInput
    val_input: ModelInput
    decoded: str  # where images are decoded, for the log
    labelled: str = ""  # how often labelled batches' images are drawn, for the log; empty: as every other image

    @classmethod
    def load(
        cls,
        train: ImageDirectory,
        validation: ImageDirectory,
        spec: TrainedModelSpec,
        params: TrainingParams,
        env: DistributedEnv,
        device: torch.device,
    ) -> TrainingData:
        workers = loader_workers(params, env, device)
        transforms = (spec.transformations, spec.image_size, spec.mean, spec.std)
        on_gpu = device.type == "cuda"
        options = {"num_workers": workers, "pin_memory": on_gpu, "persistent_workers": workers > 0}
        train_samples = train.samples()
        decode_on = where_to_decode(params, train_samples, device)
        if decode_on == "device":
            train_set = EncodedImageFiles(train_samples, train_transform(*transforms))
            val_set = EncodedImageFiles(validation.samples(), eval_transform(*transforms))
            options["collate_fn"] = collate_payloads
            pipelines = [
                DevicePipeline(s.transform, spec.transformations, spec.image_size, device) for s in (train_set, val_set)
            ]
            inputs = on_device(pipelines[0], True, device), on_device(pipelines[1], False, device)
            decoded = f"JPEGs on {device} in batches, other formats by {workers or 'this'} loader process(es)"
        else:
            # Loader processes would each fill a cache of their own: the decoded-image cache is for in-process loading.
            # The budget is per machine, shared out between its processes (each caches every image it is dealt).
            cache_bytes = params.image_cache_mb * 2**20 // env.local_world_size if workers == 0 else 0
            train_set = ImageFiles(train_samples, train_transform(*transforms), cache_bytes, normalized=False)
            val_set = ImageFiles(
                validation.samples(), eval_transform(*transforms), cache_bytes - train_set.cache_bytes, normalized=False
            )
            inputs = (
                uint8_to_device(train_set.transform.normalize, device),
                uint8_to_device(val_set.transform.normalize, device),
            )
            decoded = f"by {workers or 'this'} loader process(es)"
        # Labelled batches drawn more often: their rows repeated in what the sampler deals (a decoded image is
        # cached once, under its own row).
        rows = drawn_rows(train, params.labelled_share)
        drawn = train_set if rows is None else Subset(train_set, rows.tolist())
        labelled = "" if rows is None else labelled_draws(rows, len(train_set))
        sampler = DistributedSampler(
            drawn, num_replicas=env.world_size, rank=env.rank, shuffle=True, seed=params.random_seed
        )
        train_loader = DataLoader(drawn, batch_sampler=BatchesOfTwoOrMore(sampler, params.batch_size), **options)
        # A strided shard per rank covers every validation image exactly once (DistributedSampler would pad).
        val_shard = Subset(val_set, range(env.rank, len(val_set), env.world_size))
        val_loader = DataLoader(val_shard, batch_size=params.batch_size * 2, **options)
        if decode_on == "device":  # decoded a batch or two ahead of the step, in a thread
            train_loader, val_loader = DecodedAhead(train_loader, pipelines[0]), DecodedAhead(val_loader, pipelines[1])
        return cls(train_set, val_set, sampler, train_loader, val_loader, *inputs, decoded, labelled)
