from tasks.evaluation.comparison import comparison_rows


def test_comparison_rows_put_figures_side_by_side():
    rows = comparison_rows(
        {"accuracy": 0.5, "auc_ovr": None, "best_epoch": 3}, {"accuracy": 0.75, "f1_macro": 0.7}, "digits/1", "digits/2"
    )
    assert rows == [
        {"figure": "accuracy", "digits/1": 0.5, "digits/2": 0.75, "difference": 0.25},
        {"figure": "best_epoch", "digits/1": 3, "digits/2": None, "difference": None},
        {"figure": "f1_macro", "digits/1": None, "digits/2": 0.7, "difference": None},
    ]
