"""tasks/monitoring/drift.py: the tests of a window against the reference. Real answers of the real model: new
photos of the colours it learned show no drift; the same classes sent as grey, larger photos do, in the image
properties and the embeddings; a window too small is one line. The embeddings' test raises few false alarms on
samples of one distribution and finds a small shift."""

import numpy as np
import pandas as pd

from tasks.inference.loaded import LoadedModel
from tasks.monitoring.drift import measure_drift, mmd_test
from tasks.monitoring.reference import version_reference
from tasks.monitoring.window import look
from tests.helpers import NAME
from tests.monitoring.answers import answer, photos, publish


def test_new_photos_of_what_it_learned_do_not_drift_grey_larger_ones_do(watched):
    reference, _ = version_reference(str(watched), NAME)
    model = LoadedModel.load(f"{NAME}/1", str(watched))

    same = pd.DataFrame(answer(model, photos(120)))
    report = measure_drift(reference, same, NAME, 1)
    assert not report.drifted, report.payload()
    measured = {figure.name for figure in report.figures}
    assert {"confidence", "width", "height", "embeddings"} <= measured and "mode" not in measured  # all RGB: no test

    shifted = pd.DataFrame(answer(model, photos(120, grey=True, size=24)))
    report = measure_drift(reference, shifted, NAME, 1)
    drifted = {figure.name for figure in report.drifted}
    assert {"width", "height", "mode", "embeddings"} <= drifted, report.payload()
    assert report.headline().startswith(f"{NAME}/1: drift in ")
    assert all(figure.threshold == 0.05 / len(report.figures) for figure in report.figures)

    few = measure_drift(reference, shifted.head(30), NAME, 1)
    assert not few.figures and few.headline() == (
        f"{NAME}/1: 30 records in the window, at least 100 are needed to measure drift (a longer --since, or more "
        "traffic)"
    )


def test_the_embeddings_test_rarely_alarms_on_one_distribution_and_finds_a_small_shift():
    rng = np.random.default_rng(0)
    null = [mmd_test(rng.standard_normal((60, 32)), rng.standard_normal((60, 32)), 100, seed) for seed in range(20)]
    assert sum(p < 0.05 for _, p in null) <= 3  # about one in twenty expected
    statistic, p = mmd_test(rng.standard_normal((60, 32)), rng.standard_normal((60, 32)) + 0.5, 100)
    assert p < 0.01 and statistic > max(s for s, _ in null)


def test_an_empty_window_and_another_versions_records_are_said_in_one_line(watched, tmp_path):
    empty = look(NAME, str(tmp_path), "2026-11-29T11:00:00Z", str(watched))
    assert not empty.report.figures and empty.left_out == []
    assert empty.report.headline().startswith(f"{NAME}/1: 0 records in the window, at least 100 are needed")

    model = LoadedModel.load(f"{NAME}/1", str(watched))
    publish(str(tmp_path), answer(model, photos(2)) + answer(model, photos(3), version=2))
    found = look(NAME, str(tmp_path), "2026-11-29T11:00:00Z", str(watched), min_records=2)
    assert len(found.records) == 2 and found.left_out == [f"3 records of other versions of {NAME} left out (2: 3)"]
