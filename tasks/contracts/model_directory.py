"""The UntrainedModelDirectory and ModelDirectory contracts.

UntrainedModelDirectory (output of the model stage, input of training)::

    <root>/model_spec.json        ModelSpec: architecture and its options (and the pretrained weights' origin)
    <root>/pretrained_weights.pth with pretrained weights: the checked file, staged with the run for every node

ModelDirectory (output of training; enough to score with no other input)::

    <root>/model.pt               state dict of the best top-1 epoch (torch.load(weights_only=True))
    <root>/model_spec.json        TrainedModelSpec: the ModelSpec plus classes count and preprocessing
    <root>/classes.json           ordered class names (index = model output)
    <root>/metrics.json           TrainingMetrics: final figures and one entry per epoch
    <root>/training_log.csv       the per-epoch figures as a table
    <root>/logs/driver_log_<rank>.txt
    <root>/checkpoints/last.pt    resume state, written after every epoch
    <root>/training_curves.png    loss and accuracy by epoch (drawn by the launcher)
    <root>/model.onnx             optional: the same network for onnxruntime, dynamic batch size

This module imports neither torch nor Prefect: the launcher, the worker and the registry share it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from tasks.contracts.architectures import ARCHITECTURES, FAMILY_OPTIONS, option_error, unknown_architecture_message
from tasks.contracts.transformations import ImageTransformations
from tasks.errors import InvalidModelDirectoryError
from tasks.storage.local_files import write_text_atomic

SPEC_FILE = "model_spec.json"
STAGED_WEIGHTS_FILE = "pretrained_weights.pth"
# A registered version's weights, head included, that a warm-started training loads (tasks/model/warm_start.py).
WARM_START_FILE = "warm_start.pt"
WEIGHTS_FILE = "model.pt"
CLASSES_FILE = "classes.json"
METRICS_FILE = "metrics.json"
TRAINING_LOG_FILE = "training_log.csv"
LOGS_DIR = "logs"
CHECKPOINT_FILE = "checkpoints/last.pt"
TRAINING_CURVES_FILE = "training_curves.png"
ONNX_FILE = "model.onnx"
# A swept model's pictures of its sweep (flows/sweep.py), which its model card shows.
SWEEP_PICTURES = {
    "sweep_optimisation_history.png": "optimisation history",
    "sweep_parallel_coordinate.png": "parallel coordinates",
}
# What the version saw on its validation set, the served model's drift is measured against (tasks/monitoring/reference.py).
REFERENCE_FILES = ("reference.json", "reference.npz")
# Files a registered version carries (logs and checkpoints stay with the training run), and OPTIONAL_FILES when
# present.
MODEL_FILES = (WEIGHTS_FILE, SPEC_FILE, CLASSES_FILE, METRICS_FILE, TRAINING_LOG_FILE)
OPTIONAL_FILES = (ONNX_FILE, *SWEEP_PICTURES, *REFERENCE_FILES)

# Every name of the family table, grouped by family: a Literal, so the Prefect form offers them as a choice.
Architecture = Literal[ARCHITECTURES]  # type: ignore[valid-type]

# torchvision's ImageNet statistics: the models (and any local pretrained weights) expect them.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class PretrainedWeights(BaseModel):
    """Where a model's starting weights came from, recorded by the model stage (and carried into the trained
    model's spec and its registration)."""

    name: str = Field(description="file name, e.g. torchvision's resnet18-f37072fd.pth")
    sha256: str = Field(description="the file's full sha256, checked before it was loaded")
    source: str = Field(description="where the model stage got it: torch's cache, a mirror, a URL, s3:// or a path")


class ModelSpec(BaseModel):
    """An untrained torchvision classifier: what Azure's DenseNet / ResNet modules describe, for any family of
    tasks/contracts/architectures.py."""

    architecture: Architecture = Field(
        "resnet18", description="torchvision classifier (families and their heads: docs/parameters.md)"
    )
    pretrained: bool | None = Field(
        None,
        description="start from ImageNet weights; empty: yes for your own images, no for the bundled digits",
    )
    weights_path: str | None = Field(
        None,
        description="a .pth state dict: local path, https:// URL or s3:// URI; empty: torchvision's ImageNet file",
    )
    weights_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="the weights file's sha256 (64 hex digits); needed for a weights_path URL whose file name "
        "does not end in -<hash prefix>.pth",
    )
    weights: PretrainedWeights | None = Field(
        None, description="filled in by the model stage: the pretrained weights' file name, sha256 and source"
    )
    started_from: PretrainedWeights | None = Field(
        None,
        description="filled in by the model stage for a warm start: the registered version whose weights, head "
        "included, training started from (its reference, the weights' sha256, the registry)",
    )
    memory_efficient: bool = Field(False, description="DenseNet only: checkpointed, slower, less memory")
    zero_init_residual: bool = Field(False, description="ResNet family only: zero-init the last BN of each block")
    transformations: ImageTransformations = Field(
        default_factory=ImageTransformations,
        description="image transformations (Azure's Init Image Transformation): training applies them all, "
        "scoring only the deterministic ones; the default resizes to the training size and crops at random from "
        "the image padded by 1/8 (edge)",
    )

    @field_validator("architecture", mode="before")
    @classmethod
    def _known_architecture(cls, value: object) -> object:
        # Before the Literal's own check, whose message lists the names in one run instead of by family.
        if value not in ARCHITECTURES:
            raise ValueError(unknown_architecture_message(value))
        return value

    @model_validator(mode="after")
    def _options_match_family(self) -> ModelSpec:
        problem = option_error(self.architecture, {option: getattr(self, option) for option in FAMILY_OPTIONS})
        if problem:
            raise ValueError(problem)
        return self


class TrainedModelSpec(ModelSpec):
    num_classes: int
    image_size: int = Field(description="the training size: the side of the transformations' sizes left empty")
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD


class EpochMetrics(BaseModel):
    epoch: int
    lr: float
    train_images_per_s: float
    train_loss: float
    train_error: float
    val_loss: float
    top1: float
    top5: float
    seconds: float


class TrainingMetrics(BaseModel):
    epochs: list[EpochMetrics] = []
    best_epoch: int | None = None
    best_top1: float | None = None
    lowest_val_loss: float | None = None
    epochs_without_lower_val_loss: int = 0
    stopped_early: bool = False
    world_size: int = 1

    def add_epoch(self, record: EpochMetrics, *, patience: int, total_epochs: int) -> bool:
        """Record an epoch; returns whether it has the best top-1 so far (its weights are the ones to keep).

        Early stopping: ``stopped_early`` is set once validation loss has not decreased for ``patience``
        consecutive epochs (and epochs remain).
        """
        self.epochs.append(record)
        if self.lowest_val_loss is None or record.val_loss < self.lowest_val_loss:
            self.lowest_val_loss, self.epochs_without_lower_val_loss = record.val_loss, 0
        else:
            self.epochs_without_lower_val_loss += 1
        if self.epochs_without_lower_val_loss >= patience and record.epoch < total_epochs:
            self.stopped_early = True
        best = self.best_top1 is None or record.top1 > self.best_top1
        if best:
            self.best_top1, self.best_epoch = record.top1, record.epoch
        return best

    @property
    def final(self) -> EpochMetrics | None:
        return self.epochs[-1] if self.epochs else None


def _read_json_model(path: Path, model: type[BaseModel], what: str) -> BaseModel:
    if not path.is_file():
        raise InvalidModelDirectoryError(f"{path.parent} is not a {what}: {path.name} is missing")
    try:
        return model.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as error:
        raise InvalidModelDirectoryError(f"{path} is not a valid {what} file:\n{error}") from error


def write_model_spec(root: str | os.PathLike[str], spec: ModelSpec) -> Path:
    root = Path(root)
    write_text_atomic(root / SPEC_FILE, spec.model_dump_json(indent=2))
    return root


def read_model_spec(root: str | os.PathLike[str]) -> ModelSpec:
    """Read an UntrainedModelDirectory; anything else raises InvalidModelDirectoryError."""
    root = Path(root)
    if not root.is_dir():
        raise InvalidModelDirectoryError(f"model directory {root} does not exist or is not a directory")
    return _read_json_model(root / SPEC_FILE, ModelSpec, "model directory")


class ModelDirectory:
    """A trained model on local disk."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise InvalidModelDirectoryError(f"trained model directory {self.root} does not exist")
        self.spec = _read_json_model(self.root / SPEC_FILE, TrainedModelSpec, "trained model directory")
        if not self.weights_path.is_file():
            raise InvalidModelDirectoryError(f"{self.root} is not a trained model directory: {WEIGHTS_FILE} is missing")
        classes_path = self.root / CLASSES_FILE
        if not classes_path.is_file():
            raise InvalidModelDirectoryError(f"{self.root} is not a trained model directory: {CLASSES_FILE} is missing")
        self.classes: list[str] = json.loads(classes_path.read_text(encoding="utf-8"))
        if len(self.classes) != self.spec.num_classes:
            raise InvalidModelDirectoryError(
                f"{self.root}: {CLASSES_FILE} lists {len(self.classes)} classes, "
                f"{SPEC_FILE} says the model has {self.spec.num_classes}"
            )

    @property
    def weights_path(self) -> Path:
        return self.root / WEIGHTS_FILE

    def load_weights_into(self, model: Any) -> None:
        """Load ``model.pt`` into ``model`` (a torch module); a file that is not its state dict raises
        InvalidModelDirectoryError. Only ``weights_only`` loading: unpickling anything else can run code."""
        import pickle

        import torch  # here, not above: the registry and the launcher import this module without torch

        try:
            state = torch.load(self.weights_path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError, ImportError) as error:
            raise InvalidModelDirectoryError(
                f"{self.weights_path} cannot be read as a PyTorch state dict ({type(error).__name__}): {WEIGHTS_FILE} "
                "must be the file training writes (torch.save of model.state_dict()). Only tensors are loaded "
                "(torch.load with weights_only=True): a file holding other Python objects is refused, as "
                "unpickling it could run any code"
            ) from None
        try:
            model.load_state_dict(state)
        except (RuntimeError, TypeError, AttributeError) as error:
            raise InvalidModelDirectoryError(
                f"{self.weights_path} does not fit a {self.spec.architecture} with {self.spec.num_classes} classes "
                f"(as {SPEC_FILE} says): {str(error).splitlines()[0]}"
            ) from None

    def metrics(self) -> TrainingMetrics:
        return _read_json_model(self.root / METRICS_FILE, TrainingMetrics, "trained model directory")


# The worker logs this, then the rank, when it fails; the launcher looks for it to name the failing rank.
FAILURE_MARKER = "TRAINING FAILED on rank"
# Starts the worker's message when the loss is no longer finite: retrying cannot help, a lower rate can.
DIVERGED_MARKER = "training diverged:"


def driver_log_path(root: str | os.PathLike[str], rank: int) -> Path:
    return Path(root) / LOGS_DIR / f"driver_log_{rank}.txt"
