import numpy as np
import pandas as pd
import pytest

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.contracts.scores_table import read_scores, scores_summary, write_score_chunks, write_scores
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.evaluation.evaluate import evaluate_scores
from tasks.evaluation.score import score_chunks, score_images
from tests.helpers import COLOURS, write_class_folders, write_image


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
