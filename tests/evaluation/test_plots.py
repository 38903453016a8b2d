import numpy as np
import pandas as pd

from tasks.contracts.scores_table import write_scores
from tests.evaluation.score_tables import scores


def test_two_class_evaluations_show_roc_and_precision_recall_curves(prefect_server, tmp_path):
    import asyncio

    from PIL import Image
    from prefect import flow

    from tasks.evaluation.prefect_tasks import evaluate
    from tests.helpers import card_versions

    rng = np.random.default_rng(0)
    labels = ["cat"] * 20 + ["dog"] * 20
    dog = np.clip(np.r_[rng.normal(0.35, 0.2, 20), rng.normal(0.65, 0.2, 20)], 0.01, 0.99)
    table = pd.DataFrame(
        {
            "image": [f"{i}.png" for i in range(40)],
            "Scored Labels": np.where(dog >= 0.5, "dog", "cat"),
            "Scored Probabilities_cat": 1 - dog,
            "Scored Probabilities_dog": dog,
            "label": labels,
        }
    )
    two, three = tmp_path / "two" / "scores.csv", tmp_path / "three" / "scores.csv"
    write_scores(table, str(two))
    write_scores(scores(["cat", "dog", "cow"], ["cat", "dog", "cat"]), str(three))

    @flow(name="evaluate-two-and-three")
    def evaluate_both():
        return evaluate(str(two)), evaluate(str(three))

    evaluation, _ = evaluate_both()
    pages = [a.data for a in asyncio.run(card_versions("evaluation"))][-2:]
    assert "![ROC and precision-recall curves](data:image/png;base64," in pages[0]
    assert "'dog' is the positive class; the dot marks the threshold 0.5" in pages[0]
    assert "ROC" not in pages[1], "three classes: no two-class curves"
    with Image.open(two.with_name("roc_pr_curves.png")) as picture:
        assert picture.format == "PNG" and picture.size == (1000, 450)
    assert not three.with_name("roc_pr_curves.png").exists() and 0.5 < evaluation.auc_ovr < 1
