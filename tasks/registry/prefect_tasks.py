"""The registry stage's Prefect tasks: register a trained model (with champion/challenger promotion) and
resolve a model reference to a local ModelDirectory."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run, task_run
from pydantic import BaseModel

from tasks.evaluate import Evaluation
from tasks.model_directory import ModelDirectory
from tasks.registry import Promotion, Registration, default_model_name, lineage, load_model, register_model
from tasks.retrying import retry_unless_input_error


class RegisteredModel(BaseModel):
    registration: Registration
    location: str


def _promotion_markdown(promotion: Promotion) -> str:
    champion = "none (alias not set)" if promotion.champion_version is None else (
        f"version {promotion.champion_version}: {_figure(promotion.champion) if promotion.champion is not None else 'no value'}"
    )  # fmt: skip
    verdict = "promoted" if promotion.promoted else "not promoted: it does not beat the champion"
    return (
        f"### Promotion to `{promotion.alias}`: {verdict}\n\n| | {promotion.metric} |\n|---|---|\n"
        f"| challenger (this version) | {_figure(promotion.challenger)} |\n| champion | {champion} |\n"
    )


def _figure(value: Any) -> str:
    """Figures as a reader compares them: 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def registered_model_markdown(registration: Registration, location: str, metric: str) -> tuple[str, str]:
    """(markdown, one-line description) of the registered-model artifact."""
    headline = f"{registration.name} v{registration.version}"
    if metric in registration.metrics:
        headline += f", {metric} {_figure(registration.metrics[metric])}"
    rows = "\n".join(f"| {k} | {_figure(v)} |" for k, v in registration.metrics.items() if isinstance(v, (int, float)))
    markdown = (f"### {registration.name} version {registration.version}\n\nStored in `{location}`\n\n"
                f"| figure | value |\n|---|---|\n{rows}\n")  # fmt: skip
    return markdown, headline


@task(name="register", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE)
def register(
    registry: str,
    name: str | None,
    model_dir: str,
    evaluation: Evaluation,
    datasets: dict[str, str],
    params: dict[str, Any],
    promote_to: str | None = None,
    promotion_metric: str = "accuracy",
) -> RegisteredModel:
    """Register with metrics, parameters and the lineage of ``datasets`` (role -> ImageDirectory).

    ``name`` defaults to ``<training data set>-<architecture>``. Artifacts ``registered-model`` and, with
    ``promote_to``, ``promotion`` (champion/challenger on ``promotion_metric``).
    """
    trained = ModelDirectory(model_dir)
    training = trained.metrics()
    lineages = {role: lineage(d) for role, d in datasets.items()}  # each manifest read once
    name = name or default_model_name(lineages["train"].source, trained.spec.architecture)
    metrics = {
        **evaluation.figures(),
        "best_top1": training.best_top1,
        "best_epoch": training.best_epoch,
        "epochs_trained": len(training.epochs),
    }
    registration, location = register_model(
        registry, name, trained,
        metrics=metrics, params=params, datasets=lineages,
        flow_run_id=flow_run.get_id(), task_run_id=task_run.get_id(), promote_to=promote_to,
        promotion_metric=promotion_metric,
    )  # fmt: skip
    markdown, description = registered_model_markdown(registration, location, promotion_metric)
    create_markdown_artifact(key="registered-model", markdown=markdown, description=description)
    if registration.promotion:
        decision = registration.promotion
        champion = "no champion" if decision.champion is None else f"champion {_figure(decision.champion)}"
        create_markdown_artifact(
            key="promotion",
            markdown=_promotion_markdown(decision),
            description=f"{'promoted' if decision.promoted else 'not promoted'} to {decision.alias!r}: "
            f"{decision.metric} {_figure(decision.challenger)} vs {champion}",
        )
    return RegisteredModel(registration=registration, location=location)


@task(name="resolve-model", retries=2, retry_delay_seconds=2, retry_condition_fn=retry_unless_input_error, cache_policy=NO_CACHE)
def resolve_model(model: str, registry: str, cache_dir: str) -> str:
    """The local ModelDirectory for a ModelDirectory path or a registry reference (downloaded from S3 once)."""
    model_dir = load_model(model, registry, cache_dir)
    get_run_logger().info("model %s -> %s (%s)", model, model_dir.root, ", ".join(model_dir.classes))
    return str(model_dir.root)
