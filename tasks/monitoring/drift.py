"""A window of recorded answers against the version's reference (reference.py): is the model still seeing what it
learned from?

Four kinds of figure, each a two-sample test of the window against the reference, with its statistic, p-value,
threshold and verdict:

- prediction drift: the predicted classes' counts (chi-square on the 2 x classes table, ``scipy.stats``);
- confidence drift: the top probabilities (two-sample Kolmogorov-Smirnov);
- input drift on image properties: width and height (Kolmogorov-Smirnov), mode and EXIF orientation (chi-square);
- input drift on the embeddings: maximum mean discrepancy with an RBF kernel (its width the median distance) and a
  seeded permutation test. Written here in numpy (one kernel matrix, every permutation in one matrix product):
  alibi-detect's MMDDrift is the same test, but installing it would bring transformers, numba, opencv and
  scikit-image and move numpy and Pillow back a major version (``pip install --dry-run alibi-detect``, 2026-11-29).

A window drifts when any figure's p-value is below its threshold: ``alpha`` shared among the figures measured
(Bonferroni), so that an unshifted window raises a false alarm at most ``alpha`` of the time. Imports no torch, no
Prefect; scipy when it measures."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from tasks.monitoring.reference import Reference

ALPHA = 0.05
MIN_RECORDS = 100  # fewer, and a two-sample test of a dozen classes' shares tells little
PERMUTATIONS = 500
MMD_SAMPLE = 500  # the window's embeddings taken at most (the reference keeps as many)


@dataclass(frozen=True)
class DriftFigure:
    """One test of the window against the reference."""

    name: str  # "class shares", "confidence", "width", "height", "mode", "orientation", "embeddings"
    test: str
    statistic: float
    p_value: float
    threshold: float  # drifted when p_value < threshold
    window: int  # values of the window tested

    @property
    def drifted(self) -> bool:
        return self.p_value < self.threshold

    def as_dict(self) -> dict:
        return {**asdict(self), "drifted": self.drifted}


@dataclass
class DriftReport:
    """The window's figures, or (too few records) none and the line that says how many are needed."""

    model: str
    version: int
    records: int
    figures: list[DriftFigure] = field(default_factory=list)
    too_few: str | None = None

    @property
    def drifted(self) -> list[DriftFigure]:
        return [figure for figure in self.figures if figure.drifted]

    def headline(self) -> str:
        if self.too_few:
            return self.too_few
        which = ", ".join(figure.name for figure in self.drifted)
        verdict = f"drift in {which}" if which else "no drift"
        return f"{self.model}/{self.version}: {verdict} ({self.records} records, {len(self.figures)} figures)"

    def payload(self) -> dict:
        """What the drift event carries."""
        return {
            "model": self.model,
            "version": self.version,
            "records": self.records,
            "figures": [figure.as_dict() for figure in self.figures],
        }


def contingency(reference: dict[str, int], window: pd.Series) -> tuple[float, float] | None:
    """Chi-square of the reference's counts against the window's values (None: one category in all, no test)."""
    from scipy import stats

    seen = window.astype(str).value_counts().to_dict()
    categories = sorted(set(reference) | set(seen))
    table = np.array([[reference.get(c, 0) for c in categories], [seen.get(c, 0) for c in categories]])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return None
    result = stats.chi2_contingency(table)
    return float(result.statistic), float(result.pvalue)


def mmd_test(x: np.ndarray, y: np.ndarray, permutations: int = PERMUTATIONS, seed: int = 0) -> tuple[float, float]:
    """The squared maximum mean discrepancy of samples ``x`` and ``y`` (RBF kernel, its width the median pairwise
    distance of both) and its permutation p-value: the share of relabellings, the observed one counted, whose
    statistic is at least as large."""
    pooled = np.concatenate([x, y]).astype(np.float64)
    norms = (pooled**2).sum(axis=1)
    squared = np.maximum(norms[:, None] + norms[None, :] - 2 * pooled @ pooled.T, 0)
    width = np.median(squared[np.triu_indices(len(pooled), k=1)]) or 1.0
    kernel = np.exp(-squared / width)
    rng = np.random.default_rng(seed)
    signs = np.empty((permutations + 1, len(pooled)))
    signs[0] = np.r_[np.full(len(x), 1 / len(x)), np.full(len(y), -1 / len(y))]
    for row in range(1, permutations + 1):
        signs[row] = rng.permutation(signs[0])
    # a . K . a for every labelling a at once: the biased MMD² estimate of each
    statistics = ((signs @ kernel) * signs).sum(axis=1)
    return float(statistics[0]), float((statistics >= statistics[0]).mean())


def measure_drift(
    reference: Reference,
    records: pd.DataFrame,
    model: str,
    version: int,
    *,
    alpha: float = ALPHA,
    min_records: int = MIN_RECORDS,
    seed: int = 0,
) -> DriftReport:
    """The window ``records`` (records.py's columns, of one version) against ``reference``."""
    from scipy import stats

    report = DriftReport(model, version, len(records))
    if len(records) < min_records:
        report.too_few = (
            f"{model}/{version}: {len(records)} records in the window, at least {min_records} are needed to measure "
            "drift (a longer --since, or more traffic)"
        )
        return report
    tests: list[tuple[str, str, tuple[float, float] | None, int]] = [
        ("class shares", "chi-square", contingency(reference.predicted, records["label"]), len(records)),
    ]
    for name, sample, column in (
        ("confidence", reference.confidences, "confidence"),
        ("width", reference.widths, "width"),
        ("height", reference.heights, "height"),
    ):
        result = stats.ks_2samp(sample, records[column].to_numpy(dtype=float))
        tests.append((name, "Kolmogorov-Smirnov", (float(result.statistic), float(result.pvalue)), len(records)))
    tests.append(("mode", "chi-square", contingency(reference.modes, records["mode"]), len(records)))
    tests.append(
        ("orientation", "chi-square", contingency(reference.orientations, records["orientation"]), len(records))
    )
    embedded = records["embedding"].dropna()
    if len(embedded):
        window = np.stack(embedded.to_numpy())
        if len(window) > MMD_SAMPLE:
            window = window[np.sort(np.random.default_rng(seed).choice(len(window), MMD_SAMPLE, replace=False))]
        tests.append(
            ("embeddings", "MMD (RBF), permutations", mmd_test(reference.embeddings, window, seed=seed), len(window))
        )
    measured = [(name, test, result, n) for name, test, result, n in tests if result is not None]
    threshold = alpha / len(measured)
    report.figures = [DriftFigure(name, test, s, p, threshold, n) for name, test, (s, p), n in measured]
    return report
