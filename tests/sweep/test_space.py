"""The search space: each bound checked as its field takes it, one line for a wrong one, Optuna's distributions,
and a trial's values put into the ModelSpec and TrainingParams."""

import pytest

from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.contracts.transformations import ImageTransformations, RandomFlip
from tasks.errors import PipelineInputError
from tasks.sweep import Choice, IntRange, LogUniform, SearchSpace, apply_params
from tasks.sweep.space import check_search_space


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        (
            {"learning_rate": {"kind": "log_uniform", "low": 0.1, "high": 0.01}},
            "learning_rate: the range from 0.1 to 0.01 is inverted",
        ),
        ({"batch_size": {"kind": "int", "low": 8, "high": 8}}, "batch_size: the range from 8 to 8 is empty"),
        (
            {"batch_size": {"kind": "int", "low": 0, "high": 8}},
            "batch_size: 0 is not allowed: Input should be greater than 0",
        ),
        (
            {"architecture": {"kind": "choice", "values": ["resnet1"]}},
            "architecture: 'resnet1' is not allowed: architecture 'resnet1' is not a torchvision classifier",
        ),
        (
            {"fine_tuning": {"kind": "choice", "values": ["all", "some"]}},
            "fine_tuning: 'some' is not allowed: Input should be 'all' or 'head'",
        ),
        (
            {"architecture": {"kind": "choice", "values": []}},
            "architecture.values: List should have at least 1 item",
        ),
        (
            {"learning_rate": {"kind": "log_uniform", "low": 0, "high": 1}},
            "learning_rate.log_uniform.low: Input should be greater than 0",
        ),
        (
            {"dropout": {"kind": "uniform", "low": 0, "high": 1}},
            "search space: dropout: Extra inputs are not permitted",
        ),
        ({"transformations": []}, "transformations: give at least one transformation set"),
    ],
)
def test_a_wrong_range_or_value_is_one_line_naming_the_field(space, expected):
    with pytest.raises(PipelineInputError) as refused:
        check_search_space(space)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_the_space_becomes_optunas_distributions_and_a_trials_values_its_configs():
    flips = ImageTransformations(random_horizontal_flip=RandomFlip())
    space = SearchSpace(
        learning_rate=LogUniform(low=1e-3, high=0.1),
        batch_size=IntRange(low=8, high=32, step=8),
        architecture=Choice(values=["resnet18", "mobilenet_v3_small"]),
        fine_tuning=Choice(values=["all", "head"]),
        backbone_lr_factor=LogUniform(low=0.01, high=1),
        transformations=[ImageTransformations(), flips],
    )
    distributions = space.distributions()
    assert set(distributions) == {
        "learning_rate",
        "weight_decay",
        "batch_size",
        "architecture",
        "fine_tuning",
        "backbone_lr_factor",
        "transformations",
    }
    assert distributions["learning_rate"].log and distributions["batch_size"].step == 8
    assert distributions["transformations"].choices == (0, 1)

    model, training = apply_params(
        space,
        {"learning_rate": 0.02, "batch_size": 24, "architecture": "mobilenet_v3_small", "transformations": 1},
        ModelSpec(architecture="resnet18"),
        TrainingParams(epochs=3),
    )
    assert model.architecture == "mobilenet_v3_small" and model.transformations == flips
    assert training.learning_rate == 0.02 and training.batch_size == 24 and training.epochs == 3
