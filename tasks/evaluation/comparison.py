"""Compare two models side by side: two scores tables (evaluated here), two registered versions (their
recorded figures), or one of each."""

from __future__ import annotations

from pathlib import Path

from tasks.contracts.scores_table import read_scores
from tasks.evaluation.evaluate import evaluate_scores
from tasks.registry import resolve
from tasks.storage.s3 import is_s3_uri


def comparison_rows(left: dict, right: dict, left_name: str, right_name: str) -> list[dict]:
    """One row per numeric figure either side has: both values and ``right - left``."""
    rows = []
    for figure in [*left, *(k for k in right if k not in left)]:
        a, b = left.get(figure), right.get(figure)
        if not any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
            continue
        difference = b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
        rows.append({"figure": figure, left_name: a, right_name: b, "difference": difference})
    return rows


def figures_of(side: str, registry: str) -> tuple[str, dict]:
    """(label, figures) of a scores CSV (evaluated here) or of a registry reference (its recorded metrics)."""
    if is_s3_uri(side) or Path(side).is_file():
        return side.rsplit("/", 1)[-1], evaluate_scores(read_scores(side)).figures()
    registration = resolve(registry, side)
    return f"{registration.name}/{registration.version}", registration.metrics
