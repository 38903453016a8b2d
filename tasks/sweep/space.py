"""The search space: for each tunable field of ModelSpec or TrainingParams, a range or a list of choices, or
nothing (the field keeps the sweep's base value). Every bound and choice is checked against the field it will be
given to (an inverted or empty range, a batch size of 0 and an unknown architecture are refused before any trial
starts, in one line), and the space turns into Optuna's distributions and back into a trial's ModelSpec and
TrainingParams."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.contracts.transformations import ImageTransformations
from tasks.errors import PipelineInputError


class LogUniform(BaseModel):
    """Any value from ``low`` to ``high``, drawn uniformly on a log scale (a learning rate, a weight decay)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["log_uniform"] = "log_uniform"
    low: float = Field(gt=0)
    high: float = Field(gt=0)


class Uniform(BaseModel):
    """Any value from ``low`` to ``high``."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["uniform"] = "uniform"
    low: float
    high: float


class IntRange(BaseModel):
    """Whole numbers from ``low`` to ``high`` in steps of ``step`` (``log``: drawn on a log scale, step 1)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["int"] = "int"
    low: int
    high: int
    step: int = Field(1, gt=0)
    log: bool = False


class Choice(BaseModel):
    """One of ``values``."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["choice"] = "choice"
    values: list[str | int | float | bool] = Field(min_length=1)


Real = Annotated[LogUniform | Uniform | Choice, Field(discriminator="kind")]
Whole = Annotated[IntRange | Choice, Field(discriminator="kind")]

# Where each field of the space goes: the ModelSpec ("model") or the TrainingParams ("training").
TARGETS = {
    "learning_rate": "training",
    "batch_size": "training",
    "weight_decay": "training",
    "momentum": "training",
    "warmup_epochs": "training",
    "fine_tuning": "training",
    "backbone_lr_factor": "training",
    "architecture": "model",
    "transformations": "model",
}


class SearchSpace(BaseModel):
    """What a sweep varies; a field left empty keeps the sweep's base ModelSpec / TrainingParams value."""

    model_config = ConfigDict(extra="forbid")
    learning_rate: Real | None = Field(
        LogUniform(low=1e-4, high=0.1), description="base learning rate (multiplied by the world size)"
    )
    batch_size: Whole | None = Field(None, description="images per batch on each process")
    weight_decay: Real | None = Field(LogUniform(low=1e-6, high=1e-2), description="SGD weight decay")
    momentum: Real | None = Field(None, description="SGD (Nesterov) momentum")
    warmup_epochs: Whole | None = Field(None, description="epochs of linear learning-rate warmup")
    fine_tuning: Choice | None = Field(None, description="all: every layer; head: only the new head")
    backbone_lr_factor: Real | None = Field(None, description="the backbone's learning rate over the head's")
    architecture: Choice | None = Field(None, description="torchvision architectures to choose from")
    transformations: list[ImageTransformations] | None = Field(
        None, description="transformation sets to choose from (each Azure's Init Image Transformation options)"
    )

    @model_validator(mode="after")
    def _each_bound_fits_its_field(self) -> SearchSpace:
        for name, distribution in self.searched().items():
            if name == "transformations":
                if not distribution:
                    raise ValueError("transformations: give at least one transformation set, or leave it empty")
                continue
            if isinstance(distribution, LogUniform | Uniform | IntRange) and not distribution.low < distribution.high:
                raise ValueError(
                    f"{name}: the range from {distribution.low} to {distribution.high} is "
                    f"{'empty' if distribution.low == distribution.high else 'inverted'}: give low below high"
                )
            if isinstance(distribution, IntRange) and distribution.log and distribution.step != 1:
                raise ValueError(f"{name}: a log-scale integer range takes step 1, not {distribution.step}")
            values = distribution.values if isinstance(distribution, Choice) else [distribution.low, distribution.high]
            for value in values:
                _check_value(name, value)
        return self

    def searched(self) -> dict[str, Any]:
        """The fields the sweep varies, by name."""
        return {name: value for name in TARGETS if (value := getattr(self, name)) is not None}

    def distributions(self) -> dict[str, Any]:
        """Optuna's distribution for each searched field (a transformation set is chosen by its position)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        converted = {}
        for name, distribution in self.searched().items():
            if name == "transformations":
                converted[name] = CategoricalDistribution(list(range(len(distribution))))
            elif isinstance(distribution, Choice):
                converted[name] = CategoricalDistribution(distribution.values)
            elif isinstance(distribution, IntRange):
                converted[name] = IntDistribution(
                    distribution.low, distribution.high, step=distribution.step, log=distribution.log
                )
            else:
                converted[name] = FloatDistribution(
                    distribution.low, distribution.high, log=isinstance(distribution, LogUniform)
                )
        return converted


def _check_value(name: str, value: object) -> None:
    """``value`` as the field ``name`` would take it, or the field's own complaint."""
    try:
        if TARGETS[name] == "training":
            TrainingParams(**{name: value})
        else:
            ModelSpec(**{name: value})
    except ValidationError as error:
        message = error.errors()[0]["msg"].removeprefix("Value error, ")
        raise ValueError(f"{name}: {value!r} is not allowed: {message}") from None


def check_search_space(space: SearchSpace | dict) -> SearchSpace:
    """The space, or a PipelineInputError in one line saying which field and value is wrong."""
    if isinstance(space, SearchSpace):
        return space
    try:
        return SearchSpace.model_validate(space)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        raise PipelineInputError(f"search space: {where + ': ' if where else ''}{message}") from None


def apply_params(
    space: SearchSpace, params: dict[str, Any], model: ModelSpec, training: TrainingParams
) -> tuple[ModelSpec, TrainingParams]:
    """The ModelSpec and TrainingParams of a trial: the base ones with the trial's ``params`` (Optuna's values by
    field name) put in, each validated as the field takes it."""
    model_update, training_update = {}, {}
    for name, value in params.items():
        if name == "transformations":
            value = space.transformations[value]
        (training_update if TARGETS[name] == "training" else model_update)[name] = value
    model = ModelSpec.model_validate({**model.model_dump(), **model_update})
    training = TrainingParams.model_validate({**training.model_dump(), **training_update})
    return model, training
