"""Evaluate Model: classification figures of a scores table, computed with scikit-learn."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel

from tasks.contracts.scores_table import (
    ERROR_COLUMN,
    LABEL_COLUMN,
    SCORED_LABELS,
    probability_column,
    scored_classes,
)
from tasks.errors import NotLabeledDatasetError

if TYPE_CHECKING:
    import pandas as pd


class ClassReport(BaseModel):
    name: str
    precision: float
    recall: float
    f1: float
    support: int


class Evaluation(BaseModel):
    images: int
    accuracy: float
    precision_macro: float
    recall_macro: float
    f1_macro: float
    precision_weighted: float
    recall_weighted: float
    f1_weighted: float
    auc_ovr: float | None  # None when some class has no images in the table
    # Cross-entropy of the scored probabilities (lower is better); None when a label is not one of the classes.
    log_loss: float | None = None
    classes: list[str]
    # The macro figures average over these: the model's classes that are a label or a prediction here.
    macro_classes: list[str]
    confusion_matrix: list[list[int]]  # rows: true class, columns: predicted class
    per_class: list[ClassReport]

    def figures(self) -> dict[str, float | int | None]:
        """The scalar figures (what a registration records and a comparison shows)."""
        return self.model_dump(exclude={"per_class", "confusion_matrix", "classes", "macro_classes"})

    def headline(self) -> str:
        """One line for people: the figures that matter, to four significant digits."""
        return (
            f"accuracy {self.accuracy:.4g}, F1 (macro) {self.f1_macro:.4g} on {self.images} images "
            f"({len(self.macro_classes)} of {len(self.classes)} classes present)"
        )


def evaluate_scores(scores: pd.DataFrame) -> Evaluation:
    from sklearn import (
        metrics as skm,
    )  # here: the flows import this module at their start, most commands never evaluate

    if LABEL_COLUMN not in scores.columns:
        raise NotLabeledDatasetError("the scores table has no 'label' column: evaluation needs labeled images")
    if ERROR_COLUMN in scores.columns:  # images a sharded scoring could not read have no scores to judge
        scores = scores[scores[ERROR_COLUMN].isna()].reset_index(drop=True)
    classes = scored_classes(scores)
    truth, predicted = scores[LABEL_COLUMN].astype(str), scores[SCORED_LABELS].astype(str)
    precision, recall, f1, support = skm.precision_recall_fscore_support(
        truth, predicted, labels=classes, zero_division=0
    )
    # A class neither labelled nor predicted here has no figures of its own; averaging its zeros in would
    # halve the F1 of a perfect scoring of half the classes (scikit-learn's default labels do the same).
    present = set(truth) | set(predicted)
    macro = [i for i, c in enumerate(classes) if c in present]
    weighted = skm.precision_recall_fscore_support(
        truth, predicted, labels=classes, average="weighted", zero_division=0
    )
    ordered = sorted(classes)  # scikit-learn wants the labels, and so the probability columns, sorted
    probabilities = scores[[probability_column(c) for c in ordered]].to_numpy(dtype=float)
    auc = None
    if set(truth) == set(classes):
        if len(classes) == 2:
            auc = float(skm.roc_auc_score(truth == classes[1], scores[probability_column(classes[1])]))
        else:
            auc = float(skm.roc_auc_score(truth, probabilities, multi_class="ovr", labels=ordered))
    loss = None
    if set(truth) <= set(classes):
        # float32 softmax rows miss 1 by rounding, which scikit-learn warns about: make each row sum to 1.
        loss = float(skm.log_loss(truth, probabilities / probabilities.sum(axis=1, keepdims=True), labels=ordered))
    return Evaluation(
        images=len(scores),
        accuracy=float(skm.accuracy_score(truth, predicted)),
        precision_macro=float(np.mean(precision[macro])),
        recall_macro=float(np.mean(recall[macro])),
        f1_macro=float(np.mean(f1[macro])),
        precision_weighted=float(weighted[0]),
        recall_weighted=float(weighted[1]),
        f1_weighted=float(weighted[2]),
        auc_ovr=auc,
        log_loss=loss,
        classes=classes,
        macro_classes=[classes[i] for i in macro],
        confusion_matrix=skm.confusion_matrix(truth, predicted, labels=classes).tolist(),
        per_class=[
            ClassReport(name=c, precision=p, recall=r, f1=f, support=int(s))
            for c, p, r, f, s in zip(classes, precision, recall, f1, support)
        ],
    )


def _or_na(value: float | None, why: str) -> str:
    return f"{value:.4g}" if value is not None else f"n/a ({why})"


def evaluation_markdown(evaluation: Evaluation) -> str:
    """The figures, the per-class report and the confusion matrix as one markdown page (4 significant digits)."""
    auc = f"{evaluation.auc_ovr:.4g}" if evaluation.auc_ovr is not None else "n/a (a class has no images)"
    absent = sorted(set(evaluation.classes) - set(evaluation.macro_classes))
    macro_note = f"; left out, as neither labelled nor predicted here: {', '.join(absent)}" if absent else ""
    lines = [
        f"### Evaluation on {evaluation.images} images",
        "",
        "| figure | value |",
        "|---|---|",
        f"| accuracy | {evaluation.accuracy:.4g} |",
        f"| precision (macro) | {evaluation.precision_macro:.4g} |",
        f"| recall (macro) | {evaluation.recall_macro:.4g} |",
        f"| F1 (macro) | {evaluation.f1_macro:.4g} |",
        f"| precision (weighted) | {evaluation.precision_weighted:.4g} |",
        f"| recall (weighted) | {evaluation.recall_weighted:.4g} |",
        f"| F1 (weighted) | {evaluation.f1_weighted:.4g} |",
        f"| AUC (one-vs-rest) | {auc} |",
        f"| log loss | {_or_na(evaluation.log_loss, 'a label is not one of the classes')} |",
        "",
        f"Macro figures: the mean over the {len(evaluation.macro_classes)} classes present{macro_note}.",
        "",
        "| class | precision | recall | F1 | images |",
        "|---|---|---|---|---|",
        *(
            f"| {c.name} | {c.precision:.4g} | {c.recall:.4g} | {c.f1:.4g} | {c.support} |"
            for c in evaluation.per_class
        ),
        "",
        "Confusion matrix: one row per true class, one column per predicted class",
        "",
        "| true class ↓ predicted → | " + " | ".join(evaluation.classes) + " |",
        "|---" * (len(evaluation.classes) + 1) + "|",
        *(
            f"| **{name}** | " + " | ".join(str(n) for n in row) + " |"
            for name, row in zip(evaluation.classes, evaluation.confusion_matrix)
        ),
    ]
    return "\n".join(lines) + "\n"
