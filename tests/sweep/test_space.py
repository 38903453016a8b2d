"""The search space: the default one only when none is named, each bound checked as its field and Optuna take it
(one line for a wrong one, nothing narrowed), Optuna's distributions, a trial's values put into the ModelSpec and
TrainingParams (every field left out keeps the base value), and the line the sweep prints before its trials."""

import warnings
from pathlib import Path

import optuna
import pytest

from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.contracts.transformations import ImageTransformations, RandomFlip
from tasks.errors import PipelineInputError
from tasks.sweep import Choice, IntRange, LogUniform, SearchSpace, Uniform, apply_params
from tasks.sweep.space import DEFAULT_SPACE, check_search_space, describe_search


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
        (
            {"batch_size": {"kind": "int", "low": 8, "high": 12, "step": 8}},
            "batch_size: high 12 is not reachable from low 8 in steps of 8: give high 16, or a step that divides 4",
        ),
        (
            {"warmup_epochs": {"kind": "int", "low": 1, "high": 6, "step": 2}},
            "warmup_epochs: high 6 is not reachable from low 1 in steps of 2: give high 5 or 7, or a step that "
            "divides 5",
        ),
        (
            {"warmup_epochs": {"kind": "int", "low": 0, "high": 4, "log": True}},
            "warmup_epochs: a log-scale integer range starts at 1 or above, not at 0",
        ),
        (
            {"batch_size": {"kind": "int", "low": 8, "high": 64, "step": 8, "log": True}},
            "batch_size: a log-scale integer range takes step 1, not 8",
        ),
        (
            {"momentum": {"kind": "uniform", "low": 0.9, "high": 0.5}},
            "momentum: the range from 0.9 to 0.5 is inverted: give low below high",
        ),
        (
            {"learning_rate": {"kind": "log_uniform", "low": -0.1, "high": 0.1}},
            "learning_rate.log_uniform.low: Input should be greater than 0",
        ),
        (
            {"batch_size": {"kind": "choice", "values": [16, 32, 16]}},
            "batch_size: the choices [16, 32, 16] hold 16 twice: give each value once",
        ),
        (
            {"batch_size": {"kind": "choice", "values": [16, 16.0]}},
            "batch_size: the choices [16, 16.0] hold 16 and 16.0, one value to Optuna: give each value once",
        ),
        (
            {"learning_rate": None, "weight_decay": None},
            "search space: every field it names is empty, so it varies nothing: give a range or choice for at least "
            "one field, or no search space at all for the default one (learning_rate, weight_decay)",
        ),
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


def test_no_space_named_is_the_default_space_and_a_named_one_varies_only_its_fields():
    assert SearchSpace().searched() == SearchSpace.model_validate({}).searched() == DEFAULT_SPACE
    assert set(DEFAULT_SPACE) == {"learning_rate", "weight_decay"}
    named = check_search_space({"batch_size": {"kind": "choice", "values": [16, 32]}})
    assert set(named.searched()) == set(named.distributions()) == {"batch_size"}
    # The space as the flow's parameter form and the registration hold it, read back: the same space.
    assert SearchSpace.model_validate(SearchSpace().model_dump(mode="json")) == SearchSpace()
    assert SearchSpace.model_validate(named.model_dump(mode="json")) == named


def test_a_trials_configs_keep_the_base_value_of_every_field_left_out():
    base_model = ModelSpec(architecture="mobilenet_v3_small")
    base_training = TrainingParams(learning_rate=0.05, weight_decay=0.003, momentum=0.8, warmup_epochs=1)
    space = SearchSpace(batch_size=IntRange(low=8, high=32, step=8))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(4):
        trial = study.ask(space.distributions())
        model, training = apply_params(space, trial.params, base_model, base_training)
        assert set(trial.params) == {"batch_size"} and training.batch_size in (8, 16, 24, 32)
        assert training.model_copy(update={"batch_size": 16}) == base_training.model_copy(update={"batch_size": 16})
        assert model == base_model


@pytest.mark.parametrize(
    "space",
    [
        SearchSpace(),
        SearchSpace(batch_size=IntRange(low=8, high=64, step=8), warmup_epochs=IntRange(low=1, high=8, log=True)),
        SearchSpace(momentum=Uniform(low=0.5, high=0.95), fine_tuning=Choice(values=["all", "head"])),
    ],
)
def test_a_space_accepted_is_taken_by_optuna_as_given(space):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna warns when it narrows a range
        distributions = space.distributions()
    for name, distribution in space.searched().items():
        if isinstance(distribution, Choice):
            assert distributions[name].choices == tuple(distribution.values)
        else:
            assert (distributions[name].low, distributions[name].high) == (distribution.low, distribution.high)


def test_the_line_before_the_trials_shows_what_is_searched_and_what_each_other_field_keeps():
    flips = ImageTransformations(random_horizontal_flip=RandomFlip())
    space = SearchSpace(
        learning_rate=LogUniform(low=1e-4, high=0.1),
        batch_size=Choice(values=[16, 32]),
        warmup_epochs=IntRange(low=0, high=4, step=2),
        transformations=[ImageTransformations(), flips],
    )
    line = describe_search(space, ModelSpec(architecture="resnet18"), TrainingParams(weight_decay=0.001))
    assert line == (
        "searching: learning_rate 0.0001..0.1 (log), batch_size {16, 32}, warmup_epochs 0..4 step 2, "
        "transformations {resize+random_crop, resize+random_crop+random_horizontal_flip}; "
        "keeping: weight_decay=0.001, momentum=0.9, fine_tuning=all, backbone_lr_factor=1.0, architecture=resnet18"
    )
    default = describe_search(SearchSpace(), ModelSpec(), TrainingParams())
    assert default.startswith("searching: learning_rate 0.0001..0.1 (log), weight_decay 1e-06..0.01 (log); keeping: ")
    assert "learning_rate=" not in default and "transformations=resize+random_crop" in default


def test_the_default_space_is_the_one_help_and_the_docs_name(capsys):
    from flows.sweep import main

    with pytest.raises(SystemExit):
        main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    docs = " ".join((Path(__file__).parents[2] / "docs" / "sweeps.md").read_text().split())
    for name, distribution in DEFAULT_SPACE.items():
        assert f"{name} {distribution.low}..{distribution.high}" in docs
        assert f"{name} {distribution.low}..{distribution.high}" in shown.replace("log- uniform", "log-uniform")
    assert "Only the fields it names are varied; every other keeps the base" in shown
