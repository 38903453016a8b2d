"""The registry stage's Prefect tasks: register a trained model (with champion/challenger promotion), a person's
approval of a promotion, and resolving a model reference to a local ModelDirectory; and the model card, one
artifact per model name (``model-card-<name>``), published again after every registration and, through
flows/model_card.py's flow, every change made from the command line. The judgement and the alias move are
``promotion.py``; the pages are ``card.py``.

Approval: the flow run pauses on a typed form (Prefect's wait-for-input) that shows the challenger's figures beside
the champion's; the reviewer's answer (or no answer in time) is recorded in the version's ``status.json`` and
decides whether the alias moves. The pause blocks the flow run's own process (``pause_flow_run``, not
``suspend_flow_run``), so it works the same for a run started from Python and for one a worker started from a
deployment; it needs a Prefect server (the ephemeral one too) because the answer travels through it. The form is
answered on the paused run's page in the UI ("Resume"), or through the API: ``resume_flow_run(flow_run_id,
run_input={"decision": "approve", "reviewer": "ada", "comment": "..."})``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.orchestration import get_client
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run, task_run
from prefect.settings import get_current_settings
from prefect.states import Running
from pydantic import BaseModel, Field

from tasks.contracts.model_directory import SWEEP_PICTURES, ModelDirectory
from tasks.contracts.registry_layout import Approval, version_key
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
from tasks.registry.card import (
    figure,
    model_card_key,
    model_card_markdown,
    promotion_markdown,
    registered_model_markdown,
    review_markdown,
    verdict,
)
from tasks.registry.manage import model_versions
from tasks.registry.promotion import decide_promotion
from tasks.retrying import stage_task


class RegisteredModel(BaseModel):
    registration: Registration
    location: str


def publish_model_card(registry: str, name: str) -> str:
    """Create the next version of artifact ``model-card-<name>`` (in a flow or task run, or on its own);
    returns its key."""
    settings = get_current_settings()
    backend, views = open_backend(registry), model_versions(registry, name)
    markdown, description = model_card_markdown(
        name, backend.location, views, settings.ui_url, sweep_pictures(backend, name, views)
    )
    key = model_card_key(name)
    create_markdown_artifact(key=key, markdown=markdown, description=description)
    return key


def sweep_pictures(backend, name: str, views) -> dict[int, dict[str, bytes]]:
    """The newest swept version's pictures of its sweep, as its files hold them (older versions keep theirs; the
    card shows one set, so that it stays small)."""
    for view in reversed(views):
        stored = [file for file in SWEEP_PICTURES if file in view.registration.files]
        if stored:
            version = view.registration.version
            found = {SWEEP_PICTURES[f]: backend.read(version_key(name, version, f)) for f in stored}
            return {version: {alt: data for alt, data in found.items() if data is not None}}
    return {}


def publish_promotion(decision: Promotion) -> None:
    """Artifact ``promotion``: the champion/challenger verdict (and a person's answer, when one was asked)."""
    champion = "no champion" if decision.champion is None else f"champion {figure(decision.champion)}"
    create_markdown_artifact(
        key="promotion",
        markdown=promotion_markdown(decision) + (f"\n{decision.approval.comment}\n" if decision.approval else ""),
        description=f"{decision.alias!r}: {verdict(decision)}; {decision.metric} {figure(decision.challenger)} "
        f"vs {champion}",
    )


@stage_task
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
    (champion/challenger on its figure; with its ``approval``, the alias waits for a person: ``settle_promotion``).
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
        params={
            **params,
            "pretrained_weights": trained.spec.weights and trained.spec.weights.model_dump(),
            "started_from": trained.spec.started_from and trained.spec.started_from.model_dump(),
        },
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


@stage_task
def resolve_model(model: str, registry: str, cache_dir: str) -> str:
    """The local ModelDirectory for a ModelDirectory path or a registry reference (downloaded from S3 once)."""
    model_dir = load_model(model, registry, cache_dir)
    get_run_logger().info("model %s -> %s (%s)", model, model_dir.root, ", ".join(model_dir.classes))
    return str(model_dir.root)


# How soon a reviewer's answer is picked up; one small read of the flow run per interval while paused.
POLL_SECONDS = 2


class PromotionReview(RunInput):
    """The form on the paused run's page."""

    decision: Literal["approve", "reject"] = Field(description="approve: the alias moves to this version")
    # Required, and not blank: the server checks an answer against this schema and refuses one without a name
    # (the form cannot be submitted, ``resume_flow_run`` raises); the alias never moves on an anonymous answer.
    reviewer: str = Field(min_length=1, pattern=r"\S", description="Your name, recorded with the decision")
    comment: str = Field(default="", description="Why; recorded with the decision and shown in the model card")


def _answered_at(flow_run_id: str) -> datetime:
    """The server's time of the resume: the timestamp of the Running state the answer put the run in."""
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return state.timestamp if state is not None else datetime.now(timezone.utc)


def _carry_on_after_timeout(flow_run_id: str, timeout_s: int) -> datetime:
    """Past its pause timeout the server turns any state the run proposes into Failed; forcing Running lets
    the run finish its work and complete, with the version registered and not promoted."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(flow_run_id, Running(message=f"no approval within {timeout_s} s"), force=True)
    return datetime.now(timezone.utc)


def ask_for_approval(registry: str, registration: Registration, timeout_s: int) -> Approval:
    """Pause the calling flow run until a person answers the form or ``timeout_s`` passes. Call it from the
    flow itself: Prefect pauses flow runs, not tasks."""
    flow_run_id = flow_run.get_id()
    form = PromotionReview.with_initial_data(description=review_markdown(registry, registration))
    # A key per version: a retried flow run that was already answered gets the same answer back.
    key = f"promote-{registration.name}-{registration.version}"
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=timeout_s, poll_interval=POLL_SECONDS, key=key)
    except FlowPauseTimeout:
        return Approval(
            decision="timed out",
            comment=f"no answer within {timeout_s} s",
            flow_run_id=flow_run_id,
            answered_at=_carry_on_after_timeout(flow_run_id, timeout_s),
        )
    return Approval(
        decision="approved" if answer.decision == "approve" else "rejected",
        reviewer=answer.reviewer.strip(),
        comment=" ".join(answer.comment.split()),
        answered_at=_answered_at(flow_run_id),
        flow_run_id=flow_run_id,
    )


@stage_task
def decide_on_promotion(registry: str, registered: RegisteredModel, approval: Approval) -> RegisteredModel:
    """Record the answer and move the alias if approved; artifacts ``promotion`` and the model card again."""
    promotion = decide_promotion(registry, registered.registration, approval)
    publish_promotion(promotion)
    publish_model_card(registry, registered.registration.name)
    return registered.model_copy(
        update={"registration": registered.registration.model_copy(update={"promotion": promotion})}
    )


def settle_promotion(registry: str, registered: RegisteredModel, timeout_s: int) -> RegisteredModel:
    """For the flow: ask a person when the new version beats the champion, and act on the answer."""
    promotion = registered.registration.promotion
    if promotion is None or not promotion.awaiting_approval:
        return registered
    return decide_on_promotion(registry, registered, ask_for_approval(registry, registered.registration, timeout_s))
