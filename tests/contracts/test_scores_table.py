import subprocess
import sys

import pandas as pd
import pytest

from deployments.local import PROJECT_ROOT
from tasks.contracts.scores_table import read_scores, scores_summary, write_scores
from tasks.evaluation.evaluate import evaluate_scores
from tests.evaluation.score_tables import scores

# What a process has loaded after importing the scores table's contract, then Evaluate Model.
IMPORTS_PROBE = (
    "import sys, tasks.contracts.scores_table; contract = sorted({'torch', 'prefect', 'sklearn'} & set(sys.modules)); "
    "import tasks.evaluation.evaluate; print(contract, 'torch' in sys.modules)"
)


@pytest.mark.integration
def test_the_scores_table_contract_loads_neither_torch_nor_prefect_and_evaluation_no_torch():
    probe = subprocess.run([sys.executable, "-c", IMPORTS_PROBE], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert probe.stdout.split() == ["[]", "False"], probe.stderr


def test_scores_csv_keeps_class_names_as_text(tmp_path):
    table = scores(["01", "2"], ["01", "01"], classes=("01", "2"))
    table.to_csv(tmp_path / "s.csv", index=False)
    evaluation = evaluate_scores(read_scores(tmp_path / "s.csv"))
    assert evaluation.classes == ["01", "2"] and evaluation.accuracy == 0.5


def test_scores_go_to_s3_and_come_back(s3_bucket):
    table = scores(["01", "2"], ["01", "01"], classes=("01", "2"))
    location = write_scores(table, f"s3://{s3_bucket}/scores/run-1.csv")
    back = read_scores(location)
    pd.testing.assert_frame_equal(back, table)
    assert scores_summary(back) == "scored labels: 01: 2; mean top probability 0.800"
