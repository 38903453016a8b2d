"""The search space: for each tunable field of ModelSpec or TrainingParams, a range or a list of choices, or
nothing (the field keeps the sweep's base value). A space that names no field at all is the default space
(``DEFAULT_SPACE``: learning_rate and weight_decay); a space that names fields varies those alone. Every bound and
choice is checked against the field it will be given to, and every range as Optuna would take it (an inverted or
empty range, a step that does not reach high, a batch size of 0 and an unknown architecture are refused before any
trial starts, in one line, never narrowed), and the space turns into Optuna's distributions and back into a
trial's ModelSpec and TrainingParams. ``describe_search`` is the line a sweep prints before its first trial."""

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


# What a sweep varies when it is given no space (a space naming no field): --help and docs/sweeps.md say the same.
DEFAULT_SPACE = {"learning_rate": LogUniform(low=1e-4, high=0.1), "weight_decay": LogUniform(low=1e-6, high=1e-2)}


class SearchSpace(BaseModel):
    """What a sweep varies: the fields it names, each over its range or choices; every other field keeps the
    sweep's base ModelSpec / TrainingParams value. Naming no field at all (``SearchSpace()``, ``{}``) is
    ``DEFAULT_SPACE``."""

    model_config = ConfigDict(extra="forbid")
    learning_rate: Real | None = Field(None, description="base learning rate (multiplied by the world size)")
    batch_size: Whole | None = Field(None, description="images per batch on each process")
    weight_decay: Real | None = Field(None, description="SGD weight decay")
    momentum: Real | None = Field(None, description="SGD (Nesterov) momentum")
    warmup_epochs: Whole | None = Field(None, description="epochs of linear learning-rate warmup")
    fine_tuning: Choice | None = Field(None, description="all: every layer; head: only the new head")
    backbone_lr_factor: Real | None = Field(None, description="the backbone's learning rate over the head's")
    architecture: Choice | None = Field(None, description="torchvision architectures to choose from")
    transformations: list[ImageTransformations] | None = Field(
        None, description="transformation sets to choose from (each Azure's Init Image Transformation options)"
    )

    @model_validator(mode="before")
    @classmethod
    def _none_named_is_the_default(cls, data: Any) -> Any:
        return dict(DEFAULT_SPACE) if isinstance(data, dict) and not data else data

    @model_validator(mode="after")
    def _each_bound_fits_its_field(self) -> SearchSpace:
        if not self.searched():
            raise ValueError(
                "every field it names is empty, so it varies nothing: give a range or choice for at least one field, "
                f"or no search space at all for the default one ({', '.join(DEFAULT_SPACE)})"
            )
        for name, distribution in self.searched().items():
            if name == "transformations":
                if not distribution:
                    raise ValueError("transformations: give at least one transformation set, or leave it empty")
                continue
            if isinstance(distribution, Choice):
                _check_distinct(name, distribution.values)
            else:
                _check_range(name, distribution)
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


def _check_range(name: str, distribution: LogUniform | Uniform | IntRange) -> None:
    """The range as Optuna takes it whole: Optuna narrows a high its step does not reach (with a warning) and
    refuses the others only after the sweep has prepared its data, so each is refused here, naming what is allowed."""
    low, high = distribution.low, distribution.high
    if not low < high:
        raise ValueError(
            f"{name}: the range from {low} to {high} is {'empty' if low == high else 'inverted'}: give low below high "
            "(or a choice of one value)"
        )
    if not isinstance(distribution, IntRange):
        return
    step = distribution.step
    if distribution.log and step != 1:
        raise ValueError(f"{name}: a log-scale integer range takes step 1, not {step}")
    if distribution.log and low < 1:
        raise ValueError(f"{name}: a log-scale integer range starts at 1 or above, not at {low}")
    if (high - low) % step:
        below = low + (high - low) // step * step
        reachable = [str(below)] * (below > low) + [str(below + step)]
        raise ValueError(
            f"{name}: high {high} is not reachable from low {low} in steps of {step}: give high "
            f"{' or '.join(reachable)}, or a step that divides {high - low}"
        )


def _check_distinct(name: str, values: list) -> None:
    """Each choice once: Optuna tells a choice by its position among those equal to it (1 is True, 16 is 16.0)."""
    for position, value in enumerate(values):
        for earlier in values[:position]:
            if value == earlier:
                repeated = (
                    f"{value!r} twice"
                    if repr(value) == repr(earlier)
                    else f"{earlier!r} and {value!r}, one value to Optuna"
                )
                raise ValueError(f"{name}: the choices {values} hold {repeated}: give each value once")


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


def describe_search(space: SearchSpace, model: ModelSpec, training: TrainingParams) -> str:
    """The line a sweep prints before its first trial: each field searched with its range or choices, and each
    other tunable field with the base value it keeps, e.g. ``searching: learning_rate 0.0001..0.1 (log),
    batch_size {16, 32}; keeping: weight_decay=0.0001, ...``."""
    varied, searched, kept = space.searched(), [], []
    for name, distribution in varied.items():
        if name == "transformations":
            shown = "{" + ", ".join(_transformations(t) for t in distribution) + "}"
        elif isinstance(distribution, Choice):
            shown = "{" + ", ".join(str(value) for value in distribution.values) + "}"
        else:
            step = f" step {distribution.step}" if isinstance(distribution, IntRange) and distribution.step != 1 else ""
            log = isinstance(distribution, LogUniform) or (isinstance(distribution, IntRange) and distribution.log)
            shown = f"{distribution.low}..{distribution.high}{step}{' (log)' if log else ''}"
        searched.append(f"{name} {shown}")
    for name in TARGETS:
        if name not in varied:
            value = getattr(training if TARGETS[name] == "training" else model, name)
            kept.append(f"{name}={_transformations(value) if name == 'transformations' else value}")
    return f"searching: {', '.join(searched)}; keeping: {', '.join(kept) or 'nothing'}"


def _transformations(transformations: ImageTransformations) -> str:
    """A transformation set by the options it switches on, in the order they apply (``resize+random_crop``)."""
    on = [name for name, value in transformations if value not in (None, False)]
    return "+".join(on) or "none"
