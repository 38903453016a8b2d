"""The registry stage's Prefect tasks: register a trained model (with champion/challenger promotion) and
resolve a model reference to a local ModelDirectory; and the model card, one artifact per model name
(``model-card-<name>``), published again after every registration and every change made from the command line."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run, task_run
from prefect.settings import get_current_settings
from pydantic import BaseModel

from tasks.console import quiet_console
from tasks.model_directory import ModelDirectory
from tasks.registry import (
    Promotion,
    PromotionPolicy,
    Registration,
    default_model_name,
    lineage,
    load_model,
    open_backend,
    register_model,
)
from tasks.registry.card import model_card_key, model_card_markdown
from tasks.registry.manage import model_versions
from tasks.retrying import stage_task


class RegisteredModel(BaseModel):
    registration: Registration
    location: str


def _promotion_markdown(promotion: Promotion) -> str:
    champion = (
        "none (alias not set)"
        if promotion.champion_version is None
        else (
            f"version {promotion.champion_version}: {_figure(promotion.champion) if promotion.champion is not None else 'no value'}"
        )
    )
    verdict = _verdict(promotion)
    rule = f"{'lower' if promotion.lower_is_better else 'higher'} is better"
    if promotion.min_improvement:
        rule += f", by at least {_figure(promotion.min_improvement)}"
    return (
        f"### Promotion to `{promotion.alias}`: {verdict}\n\n| | {promotion.metric} ({rule}) |\n|---|---|\n"
        f"| challenger (this version) | {_figure(promotion.challenger)} |\n| champion | {champion} |\n"
    )


def _verdict(promotion: Promotion) -> str:
    answer = promotion.approval
    if promotion.awaiting_approval:
        return "awaiting approval: it beats the champion"
    if answer is None:
        return "promoted" if promotion.promoted else "not promoted: it does not beat the champion"
    who = f" by {answer.reviewer}" if answer.reviewer else ""
    if answer.decision == "approved":
        return f"promoted, approved{who}" if promotion.promoted else f"approved{who}, but no longer beats the champion"
    return f"not promoted: rejected{who}" if answer.decision == "rejected" else "not promoted: approval timed out"


def _figure(value: Any) -> str:
    """Figures as a reader compares them: 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def registered_model_markdown(registration: Registration, location: str, metric: str) -> tuple[str, str]:
    """(markdown, one-line description) of the registered-model artifact."""
    headline = f"{registration.name} v{registration.version}"
    if metric in registration.metrics:
        headline += f", {metric} {_figure(registration.metrics[metric])}"
    rows = "\n".join(f"| {k} | {_figure(v)} |" for k, v in registration.metrics.items() if isinstance(v, (int, float)))
    markdown = (
        f"### {registration.name} version {registration.version}\n\nStored in `{location}`\n\n"
        f"| figure | value |\n|---|---|\n{rows}\n"
    )
    return markdown, headline


def publish_model_card(registry: str, name: str) -> str:
    """Create the next version of artifact ``model-card-<name>`` (in a flow or task run, or on its own);
    returns its key."""
    settings = get_current_settings()
    markdown, description = model_card_markdown(
        name, open_backend(registry).location, model_versions(registry, name), settings.ui_url
    )
    key = model_card_key(name)
    create_markdown_artifact(key=key, markdown=markdown, description=description)
    return key


def publish_promotion(decision: Promotion) -> None:
    """Artifact ``promotion``: the champion/challenger verdict (and a person's answer, when one was asked)."""
    champion = "no champion" if decision.champion is None else f"champion {_figure(decision.champion)}"
    create_markdown_artifact(
        key="promotion",
        markdown=_promotion_markdown(decision) + (f"\n{decision.approval.comment}\n" if decision.approval else ""),
        description=f"{decision.alias!r}: {_verdict(decision)}; {decision.metric} {_figure(decision.challenger)} "
        f"vs {champion}",
    )


@flow(name="update-model-card", log_prints=True)
def update_model_card(registry: str, name: str) -> str:
    """Publish the model card again after a change made outside any run (the command line): Prefect creates
    artifacts inside a flow or task run (creating one outside is deprecated), so this small flow run does it."""
    return publish_model_card(registry, name)


def update_model_card_if_connected(registry: str, name: str) -> str:
    """For the command line: publish the card when a Prefect API is configured (never starting a server of
    its own); what happened, in one line. The flow run's own INFO lines stay off the console (the API has them)."""
    if not get_current_settings().api.url:
        return f"model card of {name} not updated: no Prefect API configured (set PREFECT_API_URL)"
    with quiet_console():
        return f"model card updated: artifact {update_model_card(registry, name)}"


@stage_task("register")
def register(
    registry: str,
    name: str | None,
    model_dir: str,
    figures: dict[str, float | int | None],
    datasets: dict[str, str],
    params: dict[str, Any],
    promotion: PromotionPolicy | None = None,
    training_run_id: str | None = None,
) -> RegisteredModel:
    """Register with the evaluation's ``figures`` (plus the training's best top-1 and epochs), parameters and the
    lineage of ``datasets`` (role -> ImageDirectory).

    ``name`` defaults to ``<training data set>-<architecture>``. ``training_run_id``: the run that began the
    training, when this run replaces a lost one (else this run): one version per training. Artifacts
    ``registered-model``, the model card ``model-card-<name>`` and, with ``promotion.promote_to``, ``promotion``
    (champion/challenger on its figure; with its ``approval``, the alias waits for a person: ``tasks.approval``).
    """
    trained = ModelDirectory(model_dir)
    training = trained.metrics()
    lineages = {role: lineage(d) for role, d in datasets.items()}  # each manifest read once
    name = name or default_model_name(lineages["train"].source, trained.spec.architecture)
    metrics = {
        **figures,
        "best_top1": training.best_top1,
        "best_epoch": training.best_epoch,
        "epochs_trained": len(training.epochs),
    }
    registration, location = register_model(
        registry,
        name,
        trained,
        metrics=metrics,
        # The trained spec's record of its starting weights, so the model card shows them.
        params={**params, "pretrained_weights": trained.spec.weights and trained.spec.weights.model_dump()},
        datasets=lineages,
        flow_run_id=flow_run.get_id(),
        task_run_id=task_run.get_id(),
        training_run_id=training_run_id or flow_run.get_id(),
        promotion=promotion,
    )
    metric = (promotion or PromotionPolicy()).promotion_metric
    markdown, description = registered_model_markdown(registration, location, metric)
    create_markdown_artifact(key="registered-model", markdown=markdown, description=description)
    if registration.promotion:
        publish_promotion(registration.promotion)
    publish_model_card(registry, name)
    return RegisteredModel(registration=registration, location=location)


@stage_task("resolve-model")
def resolve_model(model: str, registry: str, cache_dir: str) -> str:
    """The local ModelDirectory for a ModelDirectory path or a registry reference (downloaded from S3 once)."""
    model_dir = load_model(model, registry, cache_dir)
    get_run_logger().info("model %s -> %s (%s)", model, model_dir.root, ", ".join(model_dir.classes))
    return str(model_dir.root)
