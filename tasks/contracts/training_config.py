"""Training parameters: one typed object for the Prefect form, the worker's flags, checkpoints and the registry.

Defaults are Azure ML's "Train PyTorch Model" component's.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.dataclasses import dataclass


@dataclass(frozen=True)
class TrainingFolders:
    """Where a training reads (two ImageDirectories, an UntrainedModelDirectory) and writes (a ModelDirectory):
    paths or s3:// URIs. The pipeline builds it once and passes it whole: to the train task, to each node's flow
    run (a parameter of train-node), to ``launch_training``."""

    train_dir: str = Field(description="training ImageDirectory")
    validation_dir: str = Field(description="validation ImageDirectory")
    model_spec_dir: str = Field(description="UntrainedModelDirectory")
    output_dir: str = Field(
        description="ModelDirectory every node writes into (rank 0 the model files, each rank its log)"
    )

    @field_validator("*", mode="before")
    @classmethod
    def _path_as_text(cls, value: object) -> object:
        return os.fspath(value) if isinstance(value, os.PathLike) else value


class TrainingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epochs: int = Field(5, gt=0, description="number of passes over the training images")
    batch_size: int = Field(16, gt=0, description="images per batch on each process")
    warmup_epochs: int = Field(0, ge=0, description="epochs of linear learning-rate warmup")
    learning_rate: float = Field(0.001, gt=0, description="base learning rate (multiplied by the world size)")
    random_seed: int = Field(1, description="seed for weights, sampling and augmentation")
    patience: int = Field(3, gt=0, description="stop after this many epochs without lower validation loss")
    print_frequency: int = Field(
        10, gt=0, description="log training progress every N batches (and at least every 10 s)"
    )
    nodes: int | str = Field(
        1,
        description="machines taking part (torchrun --nnodes): a number, or min:max (e.g. 1:4) to start with at "
        "least min and take in more as they come (elastic)",
    )
    processes_per_node: int = Field(1, gt=0, description="worker processes per machine (torchrun --nproc-per-node)")
    rendezvous_endpoint: str | None = Field(
        None,
        description="host:port of the c10d rendezvous when nodes > 1; empty: the first node's host and a free port "
        "there, found when the nodes start",
    )
    rendezvous_id: str | None = Field(
        None, description="job id shared by every node's launcher; empty: one per launch of the nodes"
    )
    join_timeout_s: float = Field(
        600,
        gt=0,
        description="with nodes > 1: fail (and cancel every node) unless all nodes started within this many seconds",
    )
    max_restarts: int = Field(
        0, ge=0, description="torchrun restarts of failed workers (each resumes from the checkpoint)"
    )
    image_size: int | None = Field(
        None, ge=16, description="side in pixels images are resized to; empty: 224, or less for small images"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA (NCCL) when present, else CPU (Gloo)"
    )
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: bf16 autocast on CUDA, fp32 on CPU")
    decode_on: Literal["auto", "cpu", "device"] = Field(
        "auto",
        description="where images are decoded and transformed: cpu: by the loader's processes (with the decoded-image "
        "cache); device: on the training device a batch at a time (JPEGs by nvJPEG on CUDA; other formats by the "
        "loader); auto: device when training on CUDA from JPEGs (1.56x the loader's processes on an H200, "
        "BENCHMARKS.md), else cpu",
    )
    class_weighting: Literal["none", "balanced"] = Field(
        "none",
        description="balanced: each class's loss weighted by n_images / (n_classes x its images), so a class with "
        "few photos counts as much as a large one (scikit-learn's 'balanced'); none: every image counts the same",
    )
    compile: Literal["off", "on"] = Field(
        "off",
        description="on: the training step's network through torch.compile (fused kernels; the last, smaller batch "
        "of an epoch runs eagerly), compiled during the first batches of the first epoch: about a minute on a GPU "
        "host, paid back on long trainings only (BENCHMARKS.md); off: eager",
    )
    data_workers: int | None = Field(
        None, ge=0, description="DataLoader workers per process; empty: 0 on CPU, from the CPUs per process on GPU"
    )
    image_cache_mb: int = Field(
        1024,
        ge=0,
        description="keep decoded, resized images in memory up to this many MB per machine (shared out "
        "between its processes), so later epochs skip decoding; used when data_workers is 0, the CPU default; 0: off",
    )
    timeout_minutes: float | None = Field(
        None, gt=0, description="stop the training processes and fail after this many minutes; empty: no limit"
    )
    hang_timeout_s: float = Field(
        120, gt=0, description="fail when a training process has sent no heartbeat for this long (stopped, frozen)"
    )
    stall_timeout_s: float = Field(
        600,
        gt=0,
        description="fail when no training process has finished a batch for this long (stuck, e.g. waiting "
        "on a lost peer)",
    )
    collective_timeout_s: float = Field(
        300, gt=0, description="a collective operation (gradient all-reduce) waiting longer than this fails the rank"
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD (Nesterov) momentum")
    weight_decay: float = Field(1e-4, ge=0, description="SGD weight decay")
    fine_tuning: Literal["all", "head"] = Field(
        "all",
        description="all: train every layer; head: keep the (pretrained) backbone fixed, frozen weights and "
        "BatchNorm statistics, and train only the new classifier head",
    )
    backbone_lr_factor: float = Field(
        1.0,
        gt=0,
        le=1,
        description="with fine_tuning all: the backbone learns at learning_rate x this factor, the new head at "
        "learning_rate (e.g. 0.1 keeps pretrained features closer to where they started)",
    )

    labelled_share: float = Field(
        0.75,
        ge=0,
        lt=1,
        description="the least share of each epoch's draws that the images of labelled batches make (a labelling "
        "queue added with labelled_data, under <class>/labelled-<hash>/): fewer, they are drawn more than once an "
        "epoch, so that a retraining learns what the served model got wrong; 0: drawn once, as every other image",
    )

    @field_validator("nodes")
    @classmethod
    def _nodes_or_range(cls, value: int | str) -> int | str:
        low, high = node_range(value)
        if not 1 <= low <= high:
            raise ValueError(
                f"nodes is {value!r}: give a number of machines (1 or more) or min:max with 1 <= min <= max"
            )
        return f"{low}:{high}" if ":" in str(value) else low

    @model_validator(mode="after")
    def _factor_needs_a_trained_backbone(self) -> TrainingParams:
        if self.fine_tuning == "head" and self.backbone_lr_factor != 1.0:
            raise ValueError(
                f"backbone_lr_factor is {self.backbone_lr_factor} but fine_tuning is 'head', which does not train "
                "the backbone: use fine_tuning 'all' with the factor, or leave the factor at 1"
            )
        return self

    @property
    def min_nodes(self) -> int:
        return node_range(self.nodes)[0]

    @property
    def max_nodes(self) -> int:
        return node_range(self.nodes)[1]


def node_range(nodes: int | str) -> tuple[int, int]:
    """``(min, max)`` machines of a ``nodes`` value: ``2`` → (2, 2), ``"1:4"`` → (1, 4)."""
    text = str(nodes).strip()
    low, _, high = text.partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise ValueError(
            f"nodes is {nodes!r}: give a number of machines or min:max (torchrun's --nnodes form)"
        ) from None


def add_training_flags(parser) -> None:
    """Add one ``--flag`` per TrainingParams field to an argparse parser; values are validated by pydantic."""
    for name, field in TrainingParams.model_fields.items():
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=field.description)


def training_flags(params: TrainingParams) -> list[str]:
    """The inverse of ``add_training_flags``: the flags that reproduce ``params`` (unset options omitted)."""
    flags: list[str] = []
    for name, value in params.model_dump().items():
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def params_from_flags(namespace) -> TrainingParams:
    given = {name: getattr(namespace, name) for name in TrainingParams.model_fields}
    return TrainingParams(**{name: value for name, value in given.items() if value is not None})
