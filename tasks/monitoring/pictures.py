"""The drift report for people: its figures as a markdown table and three pictures (PNG, matplotlib, no display):
the confidence histograms side by side, the class shares, and the embeddings projected on the reference's first two
principal components (scikit-learn's PCA). Imports no torch, no Prefect."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

from tasks.markdown.pictures import png_markdown_of
from tasks.monitoring.drift import DriftReport
from tasks.monitoring.reference import Reference


def pyplot():
    """matplotlib's pyplot drawing into memory only, imported when a picture is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> bytes:
    plt = pyplot()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()


def confidence_histograms(reference: Reference, records: pd.DataFrame) -> bytes:
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(9, 3), sharex=True)
    bins = np.linspace(0, 1, 21)
    for ax, values, title in (
        (axes[0], reference.confidences, f"reference ({len(reference.confidences)} validation images)"),
        (axes[1], records["confidence"].to_numpy(dtype=float), f"window ({len(records)} answers)"),
    ):
        ax.hist(values, bins=bins, weights=np.full(len(values), 1 / max(len(values), 1)), color="tab:blue")
        ax.set(title=title, xlabel="top probability", ylabel="share of images")
    return _png(figure)


def class_shares(reference: Reference, records: pd.DataFrame) -> bytes:
    plt = pyplot()
    classes = reference.classes
    total = max(sum(reference.predicted.values()), 1)
    seen = records["label"].value_counts(normalize=True)
    positions = np.arange(len(classes))
    figure, ax = plt.subplots(figsize=(max(5, 0.5 * len(classes) + 2), 3))
    ax.bar(positions - 0.2, [reference.predicted.get(c, 0) / total for c in classes], 0.4, label="reference")
    ax.bar(positions + 0.2, [float(seen.get(c, 0)) for c in classes], 0.4, label="window")
    ax.set_xticks(positions, classes, rotation=45 if max(map(len, classes)) > 3 else 0)
    ax.set(title="Predicted classes", ylabel="share of images")
    ax.legend()
    return _png(figure)


def embedding_projection(reference: Reference, records: pd.DataFrame) -> bytes | None:
    """None when the window holds no embeddings or the reference too few to project."""
    from sklearn.decomposition import PCA

    embedded = records["embedding"].dropna()
    if not len(embedded) or len(reference.embeddings) < 2:
        return None
    pca = PCA(n_components=2, random_state=0).fit(reference.embeddings)
    plt = pyplot()
    figure, ax = plt.subplots(figsize=(5, 4))
    for values, label, colour in (
        (reference.embeddings, "reference", "tab:blue"),
        (np.stack(embedded.to_numpy()), "window", "tab:orange"),
    ):
        points = pca.transform(values)
        ax.scatter(points[:, 0], points[:, 1], s=8, alpha=0.5, label=label, color=colour)
    ax.set(title="Embeddings (the reference's 2 principal components)", xlabel="PC 1", ylabel="PC 2")
    ax.legend()
    return _png(figure)


def report_markdown(report: DriftReport, reference: Reference, records: pd.DataFrame, left_out: list[str]) -> str:
    """The artifact: the verdict, each figure, what the window left out, and the pictures."""
    lines = [f"# Drift of {report.model}/{report.version}", "", f"**{report.headline()}**", ""]
    if report.figures:
        lines += [
            "| figure | test | statistic | p-value | threshold | drifted |",
            "| --- | --- | --- | --- | --- | --- |",
            *(
                f"| {f.name} | {f.test} | {f.statistic:.4g} | {f.p_value:.3g} | {f.threshold:.3g} | "
                f"{'**yes**' if f.drifted else 'no'} |"
                for f in report.figures
            ),
            "",
            f"Reference: {reference.images} validation images of {reference.source.get('validation', '?')}.",
        ]
    lines += [f"- {line}" for line in left_out]
    if report.figures:
        pictures = [
            (confidence_histograms(reference, records), "confidence histograms"),
            (class_shares(reference, records), "class shares"),
            (embedding_projection(reference, records), "embedding projection"),
        ]
        lines += ["", *(png_markdown_of(data, alt) for data, alt in pictures if data is not None)]
    return "\n".join(lines) + "\n"
