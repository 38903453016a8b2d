"""What every benchmark shares: alternating repetitions, medians, and one record per figure."""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Figure:
    name: str
    ours: float
    baseline: float | None  # None: an absolute figure with nothing to compare side by side
    unit: str
    target: str  # what "good" is, in words (e.g. ">= 1.8x")
    goal: float | None = None  # the number the target names
    higher_is_better: bool = True  # for the ratio ours/baseline (or ours alone when there is no baseline)
    allowance: float | None = None  # also met when ours is within this much of the baseline (same unit)
    notes: str = ""

    @property
    def ratio(self) -> float | None:
        return self.ours / self.baseline if self.baseline else None

    @property
    def met(self) -> bool | None:
        value = self.ratio if self.baseline else self.ours
        if self.goal is None or value is None:
            return None
        if (
            self.allowance is not None
            and self.baseline is not None
            and abs(self.ours - self.baseline) <= self.allowance
        ):
            return True
        return value >= self.goal if self.higher_is_better else value <= self.goal

    def as_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio, "met": self.met}


def alternate(runs: dict[str, Callable[[], float]], repetitions: int) -> dict[str, float]:
    """Run each callable once per repetition, in turn (a, b, a, b, ...), so both see the same machine load
    and caches; returns the median of what each returned."""
    results: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repetitions):
        for name, run in runs.items():
            results[name].append(run())
    return {name: statistics.median(values) for name, values in results.items()}


def in_fresh_process(module: str, *args: str, env: Mapping[str, str] | None = None) -> str:
    """Run ``python -m module args`` in a new process from the project root; its last line of output.

    Baselines run so: a first script's process has none of our settings (allocator, threads), and a run in
    this process would leave OpenMP threads spinning that steal the cores from the next measurement."""
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=PROJECT_ROOT,
        env=None if env is None else dict(env),
    )
    return result.stdout.strip().splitlines()[-1]


def table(figures: list[Figure]) -> str:
    rows = [("figure", "ours", "baseline", "ratio", "target", "met")]
    for f in figures:
        rows.append(
            (
                f.name,
                f"{f.ours:,.1f} {f.unit}",
                f"{f.baseline:,.1f} {f.unit}" if f.baseline else "-",
                f"{f.ratio:.2f}x" if f.ratio else "-",
                f.target,
                {True: "yes", False: "NO", None: "-"}[f.met],
            )
        )
    return aligned(rows)


def aligned(rows: list[tuple[str, ...]]) -> str:
    """Rows of cells as text columns, each as wide as its widest cell."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)
