import math

import pytest

from tasks.evaluation.evaluate import evaluate_scores, evaluation_markdown
from tests.evaluation.score_tables import scores


def test_evaluation_figures_and_confusion_matrix():
    labels = ["cat", "cat", "dog", "dog", "cow", "cow"]
    predicted = ["cat", "dog", "dog", "dog", "cow", "cat"]
    evaluation = evaluate_scores(scores(labels, predicted))
    assert evaluation.accuracy == pytest.approx(4 / 6)
    assert evaluation.classes == ["cat", "dog", "cow"]
    assert evaluation.confusion_matrix == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    # precision cat 1/2, dog 2/3, cow 1; recall cat 1/2, dog 1, cow 1/2
    assert evaluation.precision_macro == pytest.approx((0.5 + 2 / 3 + 1) / 3)
    assert evaluation.recall_macro == pytest.approx((0.5 + 1 + 0.5) / 3)
    assert 0.5 < evaluation.auc_ovr <= 1
    assert "| **cow** | 1 | 0 | 1 |" in evaluation_markdown(evaluation)


def test_macro_figures_average_over_the_classes_present():
    """All right on two of the model's three classes: macro F1 1.0, not 2/3 (the absent cow's zeros left out)."""
    evaluation = evaluate_scores(scores(["cat", "dog", "dog"], ["cat", "dog", "dog"]))
    assert evaluation.f1_macro == evaluation.precision_macro == evaluation.recall_macro == 1.0
    assert evaluation.macro_classes == ["cat", "dog"] and "macro_classes" not in evaluation.figures()
    assert evaluation.per_class[2].name == "cow" and evaluation.per_class[2].support == 0
    assert "mean over the 2 classes present; left out, as neither labelled nor predicted here: cow" in (
        evaluation_markdown(evaluation)
    )
    # A wrong prediction of an absent class counts it: its precision 0 enters the mean.
    wrong = evaluate_scores(scores(["cat", "dog"], ["cat", "cow"]))
    assert wrong.macro_classes == ["cat", "dog", "cow"] and wrong.f1_macro == pytest.approx(1 / 3)


def test_evaluation_markdown_rounds_for_people_and_labels_the_matrix():
    evaluation = evaluate_scores(scores(["cat", "cat", "dog"], ["cat", "dog", "dog"]))
    markdown = evaluation_markdown(evaluation)
    assert "| accuracy | 0.6667 |" in markdown and "0.66666" not in markdown
    assert "| true class ↓ predicted → | cat | dog | cow |" in markdown
    assert evaluation.headline() == "accuracy 0.6667, F1 (macro) 0.6667 on 3 images (2 of 3 classes present)"


def test_log_loss_is_the_mean_cross_entropy_of_the_true_labels():
    # The classes are not in sorted order (cat, dog, cow): the probability columns must be matched by name.
    evaluation = evaluate_scores(scores(["cat", "dog"], ["cat", "cow"]))
    assert evaluation.log_loss == pytest.approx(-(math.log(0.8) + math.log(0.1)) / 2)
    assert evaluation.figures()["log_loss"] == evaluation.log_loss
    assert f"| log loss | {evaluation.log_loss:.4g} |" in evaluation_markdown(evaluation)


def test_auc_is_absent_when_a_class_has_no_images():
    evaluation = evaluate_scores(scores(["cat", "dog"], ["cat", "dog"]))
    assert evaluation.auc_ovr is None and evaluation.accuracy == 1.0


def test_weighted_figures_follow_class_support():
    labels = ["cat"] * 4 + ["dog"] * 2
    predicted = ["cat", "cat", "cat", "dog", "dog", "dog"]
    evaluation = evaluate_scores(scores(labels, predicted, classes=("cat", "dog")))
    # cat: precision 1, recall 3/4; dog: precision 2/3, recall 1; weights 4/6 and 2/6
    assert evaluation.precision_weighted == pytest.approx(4 / 6 * 1 + 2 / 6 * 2 / 3)
    assert evaluation.recall_weighted == pytest.approx(evaluation.accuracy) == pytest.approx(5 / 6)
    assert evaluation.f1_weighted == pytest.approx(4 / 6 * (6 / 7) + 2 / 6 * 0.8)
    assert {"f1_weighted", "auc_ovr", "images"} <= set(evaluation.figures()) and "per_class" not in evaluation.figures()
