"""The model card's pages (tasks/registry/card.py); the card on a real Prefect server, following registrations and
alias moves, is tests/flows/test_model_card.py."""


def test_a_swept_versions_card_line_gives_the_best_and_every_counted_trial():
    from tasks.registry.card import _sweep

    record = {
        "settings": {"metric": "top1"},
        "best_trial": 1,
        "importance": {"learning_rate": 0.8, "batch_size": 0.2},
        "trials": [
            {"number": 0, "state": "complete", "value": 0.5, "epochs": 3, "params": {"learning_rate": 0.001}},
            {"number": 1, "state": "complete", "value": 0.9, "epochs": 3, "params": {"learning_rate": 0.01}},
            {"number": 2, "state": "abandoned", "value": None, "epochs": 1, "params": {"learning_rate": 0.1}},
            {"number": 3, "state": "pruned", "value": None, "epochs": 1, "params": {"learning_rate": 0.1}},
        ],
    }
    line = _sweep(record)
    assert line.startswith("best of 3 trials by top1: trial 1; #0 complete 0.5 (3 epochs; learning_rate=0.001)")
    assert "#3 pruned (1 epochs; learning_rate=0.1)" in line and "#2" not in line
    assert line.endswith("importance: learning_rate 0.80, batch_size 0.20")
    assert _sweep(None) == ""
