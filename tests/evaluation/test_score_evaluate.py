import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from deployments.local import PROJECT_ROOT
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.scores_table import read_scores, scores_summary, write_score_chunks, write_scores
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.evaluation.comparison import comparison_rows
from tasks.evaluation.evaluate import evaluate_scores, evaluation_markdown
from tasks.evaluation.score import score_chunks, score_images
from tests.helpers import COLOURS, write_class_folders, write_image

# What a process has loaded after importing the scores table's contract, then Evaluate Model.
IMPORTS_PROBE = (
    "import sys, tasks.contracts.scores_table; contract = sorted({'torch', 'prefect', 'sklearn'} & set(sys.modules)); "
    "import tasks.evaluation.evaluate; print(contract, 'torch' in sys.modules)"
)


@pytest.mark.integration
def test_the_scores_table_contract_loads_neither_torch_nor_prefect_and_evaluation_no_torch():
    probe = subprocess.run([sys.executable, "-c", IMPORTS_PROBE], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert probe.stdout.split() == ["[]", "False"], probe.stderr


def test_scores_table_has_azure_columns_and_probabilities(trained_model, colour_image_dirs):
    _, val = colour_image_dirs
    table = score_images(ModelDirectory(trained_model), ImageDirectory(val))
    classes = sorted(COLOURS)
    assert list(table.columns) == ["image", "Scored Labels", *[f"Scored Probabilities_{c}" for c in classes], "label"]
    assert len(table) == 12
    probabilities = table[[f"Scored Probabilities_{c}" for c in classes]].to_numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert (table["Scored Labels"] == [classes[i] for i in probabilities.argmax(axis=1)]).all()
    assert set(table["label"]) == set(classes)


def test_scoring_through_the_device_pipeline_gives_the_loader_paths_table(trained_model, colour_image_dirs, tmp_path):
    """``decode_on="device"`` (the default on CUDA: threads read the files, the device decodes a batch at a time),
    here on the CPU: the same rows in the same order. PNGs take PIL on both paths, so the scores are the same to the
    bit; JPEGs are decoded by torchvision's libjpeg-turbo and resized by torch instead of PIL: the same labels and
    probabilities within 0.01."""
    model = ModelDirectory(trained_model)
    pngs = ImageDirectory(colour_image_dirs[1])
    options = {"batch_size": 5}  # several batches, the last one short: the threads must keep their order
    pd.testing.assert_frame_equal(
        score_images(model, pngs, decode_on="device", **options), score_images(model, pngs, decode_on="cpu", **options)
    )
    source = write_class_folders(tmp_path / "jpegs", per_class=4, seed=3, ext=".jpg")
    jpegs = ImageDirectory(convert_to_image_directory(source, tmp_path / "images").root)
    on_device = score_images(model, jpegs, decode_on="device", **options)
    by_loader = score_images(model, jpegs, decode_on="cpu", **options)
    assert list(on_device["image"]) == list(by_loader["image"]) and len(on_device) == 12
    assert (on_device["Scored Labels"] == by_loader["Scored Labels"]).all()
    columns = [column for column in on_device.columns if column.startswith("Scored Probabilities_")]
    assert np.abs(on_device[columns].to_numpy() - by_loader[columns].to_numpy()).max() < 0.01


def test_the_stage_writes_its_table_chunk_by_chunk_to_the_same_bytes(trained_model, colour_image_dirs, tmp_path):
    model, images = ModelDirectory(trained_model), ImageDirectory(colour_image_dirs[1])
    whole = write_scores(score_images(model, images, top_k=2), str(tmp_path / "whole.csv"))
    chunks = score_chunks(model, images, batch_size=2, top_k=2, chunk_rows=5)  # 12 images: chunks of 6, 6
    sizes = []
    summary = write_score_chunks(
        (sizes.append(len(c)) or c for c in chunks), str(tmp_path / "chunked.csv"), preview_rows=3
    )
    assert sizes == [6, 6]
    assert (tmp_path / "chunked.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    assert summary.rows == 12 and len(summary.head) == 3
    assert summary.text() == scores_summary(read_scores(whole))


def test_top_k_adds_the_best_labels_after_the_azure_columns(trained_model, colour_image_dirs, tmp_path):
    _, val = colour_image_dirs
    plain = score_images(ModelDirectory(trained_model), ImageDirectory(val))
    table = score_images(ModelDirectory(trained_model), ImageDirectory(val), top_k=2)
    assert list(table.columns) == [
        *plain.columns[:-1],
        "Top 1 Label",
        "Top 1 Probability",
        "Top 2 Label",
        "Top 2 Probability",
        "label",
    ]
    pd.testing.assert_frame_equal(table[plain.columns], plain)
    classes = sorted(COLOURS)
    probabilities = table[[f"Scored Probabilities_{c}" for c in classes]].to_numpy()
    assert (table["Top 1 Label"] == table["Scored Labels"]).all()
    np.testing.assert_allclose(table["Top 1 Probability"], probabilities.max(axis=1))
    second = np.sort(probabilities, axis=1)[:, -2]
    np.testing.assert_allclose(table["Top 2 Probability"], second)
    assert (table["Top 2 Label"] != table["Top 1 Label"]).all()
    assert (
        len(score_images(ModelDirectory(trained_model), ImageDirectory(val), top_k=9).columns) == len(plain.columns) + 6
    )
    with pytest.raises(Exception, match="top_k -1 is not allowed"):
        score_images(ModelDirectory(trained_model), ImageDirectory(val), top_k=-1)
    write_scores(table.assign(**{"Top 1 Label": "01"}), str(tmp_path / "scores.csv"))
    assert read_scores(tmp_path / "scores.csv")["Top 1 Label"].tolist() == ["01"] * 12


def test_unlabeled_images_score_without_label_column(trained_model, tmp_path):
    for i in range(5):
        write_image(tmp_path / "flat" / f"{i}.png", COLOURS["green"], seed=i)
    images = convert_to_image_directory(tmp_path / "flat", tmp_path / "out")
    table = score_images(ModelDirectory(trained_model), images)
    assert "label" not in table.columns and len(table) == 5
    with pytest.raises(NotLabeledDatasetError):
        evaluate_scores(table)


def test_scores_name_images_as_the_user_did_not_as_stored(trained_model, tmp_path):
    names = ["a:b.png", "photo?.png", "x" * 10 + ":" * 80 + ".png"]
    for i, name in enumerate(names):
        write_image(tmp_path / "flat" / "wrapper" / name, COLOURS["green"], seed=i)
    images = convert_to_image_directory(tmp_path / "flat", tmp_path / "out", single_class="unlabeled")
    assert "a%3Ab.png" in {r.path for r in images.records()}
    table = score_images(ModelDirectory(trained_model), images)
    assert sorted(table["image"]) == sorted(f"wrapper/{name}" for name in names)


def test_an_unloadable_model_pt_is_an_invalid_model_directory(trained_model, tmp_path):
    import pickle
    import shutil

    import torch

    from tasks.errors import InvalidModelDirectoryError

    broken = ModelDirectory(shutil.copytree(trained_model, tmp_path / "model"))
    images = convert_to_image_directory(write_class_folders(tmp_path / "src", 1), tmp_path / "out")
    broken.weights_path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(InvalidModelDirectoryError, match="model.pt cannot be read as a PyTorch state dict") as error:
        score_images(broken, images)
    assert str(broken.weights_path) in str(error.value) and "weights_only=False" not in str(error.value)

    broken.weights_path.write_bytes(pickle.dumps(pd.DataFrame(), protocol=2))  # loads only with weights_only=False
    with pytest.raises(InvalidModelDirectoryError, match="UnpicklingError"):
        score_images(broken, images)
    torch.save({"fc.weight": torch.zeros(2, 2)}, broken.weights_path)
    with pytest.raises(InvalidModelDirectoryError, match="does not fit a resnet18 with 3 classes"):
        score_images(broken, images)


def test_images_with_classes_the_model_never_saw_are_refused(trained_model, tmp_path):
    write_class_folders(tmp_path / "src", 2, classes=("red",))
    write_image(tmp_path / "src" / "purple" / "p.png", (150, 0, 150))
    images = convert_to_image_directory(tmp_path / "src", tmp_path / "out")
    with pytest.raises(InvalidDatasetError, match="purple"):
        score_images(ModelDirectory(trained_model), images)


def scores(labels, predicted, classes=("cat", "dog", "cow")):
    table = pd.DataFrame({"image": [f"{i}.png" for i in range(len(labels))], "Scored Labels": predicted})
    for c in classes:
        table[f"Scored Probabilities_{c}"] = [0.8 if p == c else 0.1 for p in predicted]
    table["label"] = labels
    return table


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


def test_scores_csv_keeps_class_names_as_text(tmp_path):
    table = scores(["01", "2"], ["01", "01"], classes=("01", "2"))
    table.to_csv(tmp_path / "s.csv", index=False)
    evaluation = evaluate_scores(read_scores(tmp_path / "s.csv"))
    assert evaluation.classes == ["01", "2"] and evaluation.accuracy == 0.5


def test_weighted_figures_follow_class_support():
    labels = ["cat"] * 4 + ["dog"] * 2
    predicted = ["cat", "cat", "cat", "dog", "dog", "dog"]
    evaluation = evaluate_scores(scores(labels, predicted, classes=("cat", "dog")))
    # cat: precision 1, recall 3/4; dog: precision 2/3, recall 1; weights 4/6 and 2/6
    assert evaluation.precision_weighted == pytest.approx(4 / 6 * 1 + 2 / 6 * 2 / 3)
    assert evaluation.recall_weighted == pytest.approx(evaluation.accuracy) == pytest.approx(5 / 6)
    assert evaluation.f1_weighted == pytest.approx(4 / 6 * (6 / 7) + 2 / 6 * 0.8)
    assert {"f1_weighted", "auc_ovr", "images"} <= set(evaluation.figures()) and "per_class" not in evaluation.figures()


def test_comparison_rows_put_figures_side_by_side():
    rows = comparison_rows(
        {"accuracy": 0.5, "auc_ovr": None, "best_epoch": 3}, {"accuracy": 0.75, "f1_macro": 0.7}, "digits/1", "digits/2"
    )
    assert rows == [
        {"figure": "accuracy", "digits/1": 0.5, "digits/2": 0.75, "difference": 0.25},
        {"figure": "best_epoch", "digits/1": 3, "digits/2": None, "difference": None},
        {"figure": "f1_macro", "digits/1": None, "digits/2": 0.7, "difference": None},
    ]


def test_scores_go_to_s3_and_come_back(s3_bucket):
    table = scores(["01", "2"], ["01", "01"], classes=("01", "2"))
    location = write_scores(table, f"s3://{s3_bucket}/scores/run-1.csv")
    back = read_scores(location)
    pd.testing.assert_frame_equal(back, table)
    assert scores_summary(back) == "scored labels: 01: 2; mean top probability 0.800"


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


def test_a_tagged_photo_scores_like_its_upright_twin_on_the_cpu(trained_model, tmp_path):
    """A photo stored sideways with EXIF orientation 6 and its upright twin get the same scores, on the loader's
    path and the device pipeline's (run on the CPU here)."""
    from PIL import Image

    from tasks.convert.conversion import convert_to_image_directory
    from tests.helpers import orientation_exif

    rng = np.random.default_rng(4)
    for name in ("phone", "twin"):
        (tmp_path / name).mkdir()
    for i in range(4):
        pixels = np.zeros((16, 24, 3), dtype=np.uint8)
        pixels[:, :12], pixels[:, 12:] = (220, 30, 30), (30, 40, 220)  # red left half, blue right half
        pixels = np.clip(pixels + rng.integers(-20, 20, pixels.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(tmp_path / "twin" / f"{i}.jpg", quality=95)
        sideways = Image.fromarray(np.rot90(pixels).copy())
        sideways.save(tmp_path / "phone" / f"{i}.jpg", quality=95, exif=orientation_exif(6))
    model_dir = ModelDirectory(trained_model)
    for decode_on in ("cpu", "device"):
        tables = [
            score_images(
                model_dir,
                convert_to_image_directory(tmp_path / name, tmp_path / f"out-{name}-{decode_on}", labeled=False),
                decode_on=decode_on,
            )
            for name in ("phone", "twin")
        ]
        columns = [c for c in tables[0].columns if c.startswith("Scored Probabilities_")]
        apart = np.abs(tables[0][columns].to_numpy() - tables[1][columns].to_numpy()).max()
        assert apart < 0.05 and list(tables[0]["Scored Labels"]) == list(tables[1]["Scored Labels"]), decode_on
