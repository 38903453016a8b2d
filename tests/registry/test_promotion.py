"""Champion-challenger promotion at registration, run against both backends."""

import pytest

from tasks.contracts.model_directory import ModelDirectory
from tasks.errors import PipelineInputError
from tasks.registry import PromotionPolicy, list_versions, read_aliases, read_registration, register_model, resolve
from tests.helpers import NAME, register_test_model


def test_champion_challenger_promotion_is_recorded(registry, trained_model):
    first = register_test_model(registry, trained_model, accuracy=0.8, promote_to="production")[0]
    assert first.promotion.promoted and first.promotion.champion_version is None
    weaker = register_test_model(registry, trained_model, accuracy=0.7, promote_to="production")[0]
    assert not weaker.promotion.promoted and (weaker.promotion.champion_version, weaker.promotion.champion) == (1, 0.8)
    assert resolve(registry, f"{NAME}@production").version == 1
    tie = register_test_model(registry, trained_model, accuracy=0.8, promote_to="production")[0]
    assert not tie.promotion.promoted, "a challenger must beat the champion, not equal it"
    stronger = register_test_model(registry, trained_model, accuracy=0.95, promote_to="production")[0]
    assert stronger.promotion.promoted and resolve(registry, f"{NAME}@production").version == 4
    assert read_registration(registry, NAME, 2).promotion == weaker.promotion
    assert read_aliases(registry, NAME)["production"].previous_version == 1

    with pytest.raises(PipelineInputError, match=r"'f1' is not among this model's figures: \['accuracy'\]"):
        register_test_model(registry, trained_model, promote_to="production", promotion_metric="f1")
    assert list_versions(registry, NAME) == [1, 2, 3, 4], "a refused promotion claims no version"


def test_lower_is_better_figures_and_a_minimum_improvement(registry, trained_model):
    def attempt(loss, **rule):
        return register_model(
            registry,
            NAME,
            ModelDirectory(trained_model),
            metrics={"log_loss": loss},
            params={},
            datasets={},
            promotion=PromotionPolicy(promote_to="production", promotion_metric="log_loss", **rule),
        )[0].promotion

    assert attempt(0.40).promoted
    worse = attempt(0.50)
    assert not worse.promoted and worse.lower_is_better, "a figure named ...loss is lower-is-better"
    assert not attempt(0.38, min_improvement=0.05).promoted, "better by 0.02 only"
    stronger = attempt(0.30, min_improvement=0.05)
    assert stronger.promoted and (stronger.champion, stronger.min_improvement) == (0.40, 0.05)
    assert resolve(registry, f"{NAME}@production").version == 4
    assert attempt(0.20, lower_is_better=False).promoted is False, "told higher is better, a lower loss loses"
    assert read_registration(registry, NAME, 4).promotion == stronger

    with pytest.raises(PipelineInputError, match=r"minimum improvement -0.1 is not allowed: use a number >= 0"):
        attempt(0.1, min_improvement=-0.1)
    assert list_versions(registry, NAME) == [1, 2, 3, 4, 5], "a refused rule claims no version"
