"""Pictures for people: training curves, confusion matrices and two-class ROC / precision-recall curves, as
PNG files (matplotlib, no display)."""

from __future__ import annotations

import os

import numpy as np

from tasks.contracts.model_directory import TrainingMetrics


def pyplot():
    """matplotlib's pyplot drawing into files only (no display), imported when a picture is drawn: every flow
    and command imports this module, most of them to draw nothing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def significant(value, digits: int = 4):
    """Floats rounded for people in tables (4 significant digits); anything else as it is."""
    return float(f"{value:.{digits}g}") if isinstance(value, float) else value


def plot_training_curves(metrics: TrainingMetrics, path: str | os.PathLike[str]) -> None:
    plt = pyplot()
    epochs = [e.epoch for e in metrics.epochs]
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(10, 4))
    loss_axes.plot(epochs, [e.train_loss for e in metrics.epochs], marker="o", label="training")
    loss_axes.plot(epochs, [e.val_loss for e in metrics.epochs], marker="o", label="validation")
    loss_axes.set(title="Loss", xlabel="epoch", ylabel="cross-entropy")
    loss_axes.legend()
    accuracy_axes.plot(epochs, [e.top1 for e in metrics.epochs], marker="o", label="top-1")
    accuracy_axes.plot(epochs, [e.top5 for e in metrics.epochs], marker="o", label="top-5")
    accuracy_axes.set(title="Validation accuracy", xlabel="epoch", ylim=(0, 1.02))
    accuracy_axes.legend()
    for axes in (loss_axes, accuracy_axes):
        axes.set_xticks(epochs)
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_confusion_matrix(matrix: list[list[int]], classes: list[str], path: str | os.PathLike[str]) -> None:
    size = min(14, 3 + 0.5 * len(classes))
    from sklearn.metrics import ConfusionMatrixDisplay

    plt = pyplot()
    figure, axes = plt.subplots(figsize=(size, size))
    ConfusionMatrixDisplay(confusion_matrix=np.array(matrix), display_labels=classes).plot(
        ax=axes, cmap="Blues", colorbar=False, xticks_rotation=45 if max(map(len, classes)) > 3 else "horizontal"
    )
    axes.set_title("Confusion matrix (rows: true class)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_two_class_curves(
    labels: np.ndarray, probability: np.ndarray, positive: str, threshold: float, path: str | os.PathLike[str]
) -> None:
    """ROC (with its AUC) and precision-recall (with average precision) of ``probability`` of class ``positive``
    against the true ``labels``, the point of the decision ``probability >= threshold`` marked on both."""
    from sklearn.metrics import PrecisionRecallDisplay, RocCurveDisplay, precision_score, recall_score

    plt = pyplot()
    figure, (roc_axes, pr_axes) = plt.subplots(1, 2, figsize=(10, 4.5))
    options = {"pos_label": positive, "name": positive, "plot_chance_level": True}
    RocCurveDisplay.from_predictions(labels, probability, ax=roc_axes, **options)
    PrecisionRecallDisplay.from_predictions(labels, probability, ax=pr_axes, **options)
    is_positive = labels == positive
    decided = probability >= threshold
    recall = recall_score(is_positive, decided, zero_division=0)
    false_positive_rate = float(np.mean(decided[~is_positive])) if (~is_positive).any() else 0.0
    label = f"threshold {threshold:g}"
    roc_axes.plot([false_positive_rate], [recall], "o", color="black", label=label)
    pr_axes.plot([recall], [precision_score(is_positive, decided, zero_division=0)], "o", color="black", label=label)
    roc_axes.set_title(f"ROC ('{positive}' is positive)")
    pr_axes.set_title(f"Precision-recall ('{positive}' is positive)")
    for axes in (roc_axes, pr_axes):
        axes.legend(loc="lower right" if axes is roc_axes else "lower left")
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
