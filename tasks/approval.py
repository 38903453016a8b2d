"""Human approval of a promotion: the flow run pauses on a typed form (Prefect's wait-for-input) that shows
the challenger's figures beside the champion's; the reviewer's answer (or no answer in time) is recorded in
the version's ``status.json`` and decides whether the alias moves.

The pause blocks the flow run's own process (``pause_flow_run``, not ``suspend_flow_run``), so it works the
same for a run started from Python and for one a worker started from a deployment; it needs a Prefect server
(the ephemeral one too) because the answer travels through it. The form is answered on the paused run's page
in the UI ("Resume"), or through the API: ``resume_flow_run(flow_run_id, run_input={"decision": "approve",
"reviewer": "ada", "comment": "..."})``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from prefect.client.orchestration import get_client
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.runtime import flow_run
from prefect.states import Running
from pydantic import Field

from tasks.registry import Registration, resolve
from tasks.registry.card import KEY_FIGURES, figure
from tasks.registry.layout import Approval
from tasks.registry.manage import decide_promotion
from tasks.registry.prefect_tasks import RegisteredModel, publish_model_card, publish_promotion
from tasks.retrying import stage_task

# How soon a reviewer's answer is picked up; one small read of the flow run per interval while paused.
POLL_SECONDS = 2


class PromotionReview(RunInput):
    """The form on the paused run's page."""

    decision: Literal["approve", "reject"] = Field(description="approve: the alias moves to this version")
    # Required, and not blank: the server checks an answer against this schema and refuses one without a name
    # (the form cannot be submitted, ``resume_flow_run`` raises); the alias never moves on an anonymous answer.
    reviewer: str = Field(min_length=1, pattern=r"\S", description="Your name, recorded with the decision")
    comment: str = Field(default="", description="Why; recorded with the decision and shown in the model card")


def review_markdown(registry: str, registration: Registration) -> str:
    """What the reviewer reads above the form: this version's figures beside the alias's current version's."""
    promotion = registration.promotion
    assert promotion is not None
    champion = (
        resolve(registry, f"{registration.name}/{promotion.champion_version}") if promotion.champion_version else None
    )
    figures = [promotion.metric, *(f for f in KEY_FIGURES if f != promotion.metric and f in registration.metrics)]
    rows = [
        f"| {f}{' (decides)' if f == promotion.metric else ''} | {figure(registration.metrics.get(f))} | "
        f"{figure(champion.metrics.get(f)) if champion else 'none'} |"
        for f in figures
    ]
    direction = "lower" if promotion.lower_is_better else "higher"
    return "\n".join(
        [
            f"### Promote {registration.name} version {registration.version} to `{promotion.alias}`?",
            "",
            (
                f"It beats the champion on {promotion.metric} ({direction} is better"
                + (f", by at least {figure(promotion.min_improvement)}" if promotion.min_improvement else "")
                + ")."
                if champion
                else f"`{promotion.alias}` is not set yet: this would be its first version."
            ),
            "",
            f"| figure | challenger: version {registration.version} | champion: "
            + (f"version {promotion.champion_version} |" if champion else "none |"),
            "|---|---|---|",
            *rows,
            "",
            "Approve to move the alias; reject to leave it where it is. No answer in time: not promoted.",
        ]
    )


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


@stage_task("decide-promotion")
def decide(registry: str, registered: RegisteredModel, approval: Approval) -> RegisteredModel:
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
    return decide(registry, registered, ask_for_approval(registry, registered.registration, timeout_s))
