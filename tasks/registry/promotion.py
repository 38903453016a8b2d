"""Champion and challenger, in one place: the policy a run is given (``PromotionPolicy``: which alias, on which
figure, whether a person approves), the rule it judges by (``PromotionRule``), the judgement against the alias's
current version, the alias moved (by compare-and-swap, tasks/registry/core.py) when the challenger wins, and a
person's answer acted on (``decide_promotion``) when the policy asks for approval. The pause that asks the person is
``prefect_tasks.settle_promotion``; the pages they read are ``card.py``. The verdict recorded with a version is
``registry_layout.Promotion``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tasks.contracts.registry_layout import AliasRecord, Approval, Promotion, Registration, check_alias
from tasks.errors import PipelineInputError
from tasks.registry.backends import RegistryBackend
from tasks.registry.core import Registry, _alias, _move_alias, backend_of, read_registration
from tasks.registry.status import change_status


class PromotionRule(BaseModel):
    """How a challenger is judged: on ``metric``, in its direction, by at least ``min_improvement``."""

    metric: str = "accuracy"
    lower_is_better: bool = False
    min_improvement: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    @classmethod
    def for_metric(
        cls, metric: str, lower_is_better: bool | None = None, min_improvement: float = 0.0
    ) -> PromotionRule:
        """``lower_is_better`` None: a figure named ``...loss`` (e.g. ``log_loss``) is lower-is-better."""
        if not isinstance(min_improvement, (int, float)) or not 0 <= min_improvement < float("inf"):
            raise PipelineInputError(
                f"minimum improvement {min_improvement!r} is not allowed: use a number >= 0, "
                "in the promotion figure's units (e.g. 0.01 for one point of accuracy)"
            )
        direction = metric.endswith("loss") if lower_is_better is None else lower_is_better
        return cls(metric=metric, lower_is_better=direction, min_improvement=min_improvement)

    def beats(self, challenger: float, champion: float) -> bool:
        """Strictly better, and by at least ``min_improvement``."""
        gain = champion - challenger if self.lower_is_better else challenger - champion
        return gain > 0 and gain >= self.min_improvement


class PromotionPolicy(BaseModel):
    """Whether a new version takes an alias, and how that is decided: champion/challenger on a figure (the
    ``PromotionRule``) and, when asked, a person's approval. The one parameter the pipeline flow, the register task
    and the command line (``--promote-to`` … ``--approval-timeout-s``) pass."""

    promote_to: str | None = Field(
        None, description="alias (e.g. production) the new version takes only if it beats the alias's current version"
    )
    promotion_metric: str = Field(
        "accuracy", description="figure compared for promotion (accuracy, f1_macro, auc_ovr, log_loss, ...)"
    )
    lower_is_better: bool | None = Field(
        None, description="a lower figure is better; empty: yes for figures named ...loss (log_loss), else no"
    )
    min_improvement: float = Field(
        0.0, description="how much better than the champion the new version must be (in the figure's units)"
    )
    approval: bool = Field(
        False,
        description="with promote_to: a new version that beats the champion takes the alias only once a person "
        "approves it (the run pauses on a form)",
    )
    approval_timeout_s: int = Field(
        3600, gt=0, description="how long the run waits for that answer; no answer in time: not promoted"
    )

    def rule(self) -> PromotionRule:
        return PromotionRule.for_metric(self.promotion_metric, self.lower_is_better, self.min_improvement)


def check_metric(metrics: dict[str, Any], metric: str) -> float:
    value = metrics.get(metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        numeric = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise PipelineInputError(f"promotion metric {metric!r} is not among this model's figures: {numeric}")
    return float(value)


def _judge(
    backend: RegistryBackend,
    name: str,
    alias: str,
    rule: PromotionRule,
    value: float,
    current: AliasRecord | None,
    version: int | None = None,
) -> Promotion:
    """Champion/challenger against the alias as it is now: an alias not yet set (or already on ``version``)
    is taken; otherwise only by beating the champion strictly, in the rule's direction and by at least its
    minimum improvement. A champion without the figure keeps the alias: nothing shows the challenger is better."""
    decision = {
        "alias": alias,
        "metric": rule.metric,
        "challenger": value,
        "lower_is_better": rule.lower_is_better,
        "min_improvement": rule.min_improvement,
    }
    if current is None:
        return Promotion(**decision, champion_version=None, champion=None, promoted=True)
    if current.version == version:  # a retry finding its own earlier promotion
        return Promotion(**decision, champion_version=version, champion=value, promoted=True)
    best = read_registration(backend, name, current.version).metrics.get(rule.metric)
    best = float(best) if isinstance(best, (int, float)) and not isinstance(best, bool) else None
    return Promotion(
        **decision,
        champion_version=current.version,
        champion=best,
        promoted=best is not None and rule.beats(value, best),
    )


def challenge(registry: Registry, name: str, alias: str, rule: PromotionRule, metrics: dict[str, Any]) -> Promotion:
    """Should a version with ``metrics`` take ``alias`` now, by ``rule``? (See ``_judge``.)"""
    backend = backend_of(registry)
    value = check_metric(metrics, rule.metric)
    return _judge(backend, name, alias, rule, value, _alias(backend, name, check_alias(alias)))


def promote(backend: RegistryBackend, registration: Registration, alias: str, rule: PromotionRule) -> Promotion:
    """Move ``alias`` to the version if it beats the champion, judged again after every lost swap."""
    value = check_metric(registration.metrics, rule.metric)
    verdict: list[Promotion] = []

    def beats(current: AliasRecord | None) -> bool:
        verdict.append(_judge(backend, registration.name, alias, rule, value, current, registration.version))
        return verdict[-1].promoted and (current is None or current.version != registration.version)

    _move_alias(backend, registration.name, alias, registration.version, beats)
    return verdict[-1]


def decide_promotion(registry: Registry, registration: Registration, approval: Approval) -> Promotion:
    """Record a person's answer to a promotion awaiting approval (in ``status.json``), then, if approved, move
    the alias: judged again against the champion of now, which may have changed while the person looked."""
    pending = registration.promotion
    if pending is None or not pending.awaiting_approval:
        raise PipelineInputError(f"{registration.name}/{registration.version} has no promotion awaiting approval")
    backend = backend_of(registry)
    change_status(backend, registration, lambda s: s.model_copy(update={"approval": approval}))
    if approval.decision != "approved":
        return pending.model_copy(update={"awaiting_approval": False, "approval": approval})
    rule = PromotionRule(
        metric=pending.metric, lower_is_better=pending.lower_is_better, min_improvement=pending.min_improvement
    )
    return promote(backend, registration, pending.alias, rule).model_copy(update={"approval": approval})
