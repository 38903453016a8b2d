"""The registry's pages in markdown: the model card, every version of one model name (the Prefect artifact
``model-card-<name>``, published by ``prefect_tasks.publish_model_card``); a registered version; a promotion's
verdict; and what a reviewer reads above the approval form. Pure: it formats what the registry holds and imports
no Prefect."""

from __future__ import annotations

import re

from tasks.contracts.registry_layout import Approval, DatasetLineage, Promotion, Registration
from tasks.contracts.transformations import ImageTransformations
from tasks.markdown import png_markdown_of
from tasks.registry.core import resolve
from tasks.registry.manage import VersionView

# The figures a reader compares versions by, in this order, when a version has them.
KEY_FIGURES = {"accuracy": "accuracy", "f1_macro": "F1 (macro)", "auc_ovr": "AUC", "log_loss": "log loss"}
HASH_SHOWN = 12


def model_card_key(name: str) -> str:
    """Prefect artifact keys hold only lowercase letters, digits and dashes: '.' and '_' of a name become '-'."""
    return "model-card-" + re.sub(r"[^a-z0-9-]", "-", name)


def figure(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def _flow_run(flow_run_id: str | None, ui_url: str | None) -> str:
    if not flow_run_id:
        return ""
    return f"[{flow_run_id[:8]}]({ui_url.rstrip('/')}/runs/flow-run/{flow_run_id})" if ui_url else f"`{flow_run_id}`"


def _approval(approval: Approval | None) -> str:
    if approval is None:
        return ""
    who = f" by {approval.reviewer}" if approval.reviewer else ""
    comment = f": “{approval.comment}”" if approval.comment else ""
    return f"{approval.decision}{who}, {approval.answered_at:%Y-%m-%d %H:%M} UTC{comment}".replace("|", "/")


def _weights(record: dict | None) -> str:
    return f"{record['name']} `{record['sha256'][:HASH_SHOWN]}`" if record else ""


def _dataset(role: str, lineage: DatasetLineage) -> str:
    cell = f"{role} `{lineage.content_hash[:HASH_SHOWN]}` ({lineage.images} images)"
    if split := lineage.split:
        share = split.fraction if split.side == "first" else 1 - split.fraction
        cell += f", {share:.0%} of `{split.source_content_hash[:HASH_SHOWN]}` split with seed {split.seed}"
    return cell


def _transformations(model: dict | None) -> str:
    """The training transformations of the version's model spec, in words; empty for a record without a spec."""
    if not model:
        return ""
    return ImageTransformations.model_validate(model.get("transformations") or {}).describe().replace("|", "/")


def _sweep(record: dict | None) -> str:
    """A swept version's trials: the best, then every trial's state, figure and parameters; the importances."""
    if not record:
        return ""
    metric = record["settings"]["metric"]

    def trial(t: dict) -> str:
        values = ", ".join(f"{k}={figure(v)}" for k, v in t["params"].items())
        value = f" {figure(t['value'])}" if t["value"] is not None else ""
        return f"#{t['number']} {t['state']}{value} ({t['epochs']} epochs; {values})"

    counted = [t for t in record["trials"] if t["state"] != "abandoned"]
    ranked = ", ".join(f"{name} {value:.2f}" for name, value in record.get("importance", {}).items())
    return (
        f"best of {len(counted)} trials by {metric}: trial {record['best_trial']}; "
        + "; ".join(trial(t) for t in counted)
        + (f"; importance: {ranked}" if ranked else "")
    ).replace("|", "/")


def _status(view: VersionView) -> str:
    """The version's state in a few words: archived, awaiting approval, or the approval's decision and reviewer."""
    words = ["archived"] if view.archived else []
    if (promotion := view.registration.promotion) is not None and promotion.awaiting_approval and not view.approval:
        words.append("awaiting approval")
    if view.approval is not None:
        words.append(f"{view.approval.decision}" + (f" by {view.approval.reviewer}" if view.approval.reviewer else ""))
    return ", ".join(words).replace("|", "/")


def _row(view: VersionView, figures: list[str], ui_url: str | None) -> str:
    """The version's key figures: a row narrow enough for a 1440 px window whatever the figures' names."""
    r = view.registration
    cells = [
        str(r.version),
        f"{r.created_at:%Y-%m-%d}",
        *(figure(r.metrics.get(f)) for f in figures),
        " ".join(f"`{a}`" for a in view.aliases),
        _status(view),
        _flow_run(r.flow_run_id, ui_url),
    ]
    return "| " + " | ".join(cells) + " |"


def _pictures(pictures: dict[str, bytes]) -> list[str]:
    """PNGs inline (the Prefect UI shows a markdown artifact's data URIs; no file server needed)."""
    return [png_markdown_of(data, alt) for alt, data in pictures.items()]


def _details(view: VersionView, pictures: dict[str, bytes]) -> list[str]:
    """Everything else about a version, one line each, below the table; then its pictures."""
    r = view.registration
    items = {
        "registered": f"{r.created_at:%Y-%m-%d %H:%M} UTC",
        "datasets (content hash)": "; ".join(_dataset(role, d) for role, d in r.datasets.items()),
        "transformations": _transformations(r.params.get("model")),
        "pretrained weights": _weights(r.params.get("pretrained_weights")),
        "warm start from": _weights(r.params.get("started_from")),
        "sweep": _sweep(r.params.get("sweep")),
        "tags": ", ".join(f"{k}={v}" for k, v in sorted(view.tags.items())),
        "approval": _approval(view.approval),
    }
    shown = [line for picture in _pictures(pictures) for line in (picture, "")]
    return [f"**Version {r.version}**", "", *(f"- {k}: {v}" for k, v in items.items() if v), "", *shown]


def model_card_markdown(
    name: str,
    location: str,
    views: list[VersionView],
    ui_url: str | None,
    pictures: dict[int, dict[str, bytes]] | None = None,
) -> tuple[str, str]:
    """(markdown, one-line description) of the card: a table of the key figures, one row per version, newest
    first, then each version's details (data, transformations, weights, tags, approval) and ``pictures`` (by
    version: PNGs by caption, e.g. a swept version's sweep)."""
    figures = [f for f in KEY_FIGURES if any(f in v.registration.metrics for v in views)]
    aliases = sorted((a, v.registration.version) for v in views for a in v.aliases)
    alias_line = ", ".join(f"`{a}` → {version}" for a, version in aliases) or "none"
    header = ["version", "registered", *(KEY_FIGURES[f] for f in figures), "aliases", "status", "flow run"]
    lines = [
        f"### Model card: {name}",
        "",
        f"Registry `{location}`: {len(views)} version{'s' * (len(views) != 1)}; aliases: {alias_line}",
        "",
        "| " + " | ".join(header) + " |",
        "|---" * len(header) + "|",
        *(_row(v, figures, ui_url) for v in reversed(views)),
        "",
        "#### Details",
        "",
        *(line for v in reversed(views) for line in _details(v, (pictures or {}).get(v.registration.version, {}))),
        f"Fetch one: `image-classifier registry --registry {location} show {name}/<version>`",
    ]
    description = f"{name}: {len(views)} version{'s' * (len(views) != 1)}; aliases: {alias_line.replace('`', '')}"
    return "\n".join(lines) + "\n", description


def promotion_markdown(promotion: Promotion) -> str:
    """The champion/challenger verdict as a small table (the ``promotion`` artifact)."""
    champion = (
        "none (alias not set)"
        if promotion.champion_version is None
        else (
            f"version {promotion.champion_version}: {figure(promotion.champion) if promotion.champion is not None else 'no value'}"
        )
    )
    rule = f"{'lower' if promotion.lower_is_better else 'higher'} is better"
    if promotion.min_improvement:
        rule += f", by at least {figure(promotion.min_improvement)}"
    return (
        f"### Promotion to `{promotion.alias}`: {verdict(promotion)}\n\n| | {promotion.metric} ({rule}) |\n|---|---|\n"
        f"| challenger (this version) | {figure(promotion.challenger)} |\n| champion | {champion} |\n"
    )


def verdict(promotion: Promotion) -> str:
    """The outcome in words, a person's answer included."""
    answer = promotion.approval
    if promotion.awaiting_approval:
        return "awaiting approval: it beats the champion"
    if answer is None:
        return "promoted" if promotion.promoted else "not promoted: it does not beat the champion"
    who = f" by {answer.reviewer}" if answer.reviewer else ""
    if answer.decision == "approved":
        return f"promoted, approved{who}" if promotion.promoted else f"approved{who}, but no longer beats the champion"
    return f"not promoted: rejected{who}" if answer.decision == "rejected" else "not promoted: approval timed out"


def registered_model_markdown(registration: Registration, location: str, metric: str) -> tuple[str, str]:
    """(markdown, one-line description) of the registered-model artifact."""
    headline = f"{registration.name} v{registration.version}"
    if registration.metrics.get(metric) is not None:
        headline += f", {metric} {figure(registration.metrics[metric])}"
    rows = "\n".join(f"| {k} | {figure(v)} |" for k, v in registration.metrics.items() if isinstance(v, (int, float)))
    markdown = (
        f"### {registration.name} version {registration.version}\n\nStored in `{location}`\n\n"
        f"| figure | value |\n|---|---|\n{rows}\n"
    )
    return markdown, headline


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
