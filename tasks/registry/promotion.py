"""Champion and challenger: the figure a promotion is judged on, the judgement against the alias's current
version, and the alias moved (by compare-and-swap, tasks/registry/core.py) when the challenger wins. A person's
approval (tasks/approval.py, manage.decide_promotion) comes between the judgement and the move when asked for."""

from __future__ import annotations

from typing import Any

from tasks.errors import PipelineInputError
from tasks.registry.backends import RegistryBackend
from tasks.registry.core import Registry, _alias, _move_alias, backend_of, read_registration
from tasks.registry.layout import AliasRecord, Promotion, PromotionRule, Registration, check_alias


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
