"""tasks/predict (``Classifier``) and ``image-classifier predict``: a few photos labelled at once, with scoring's own
decode and transforms (the same numbers as ``score_images``), no server, nothing written."""

import json

import numpy as np
import pytest
from PIL import Image

from flows.cli import main
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.convert.conversion import convert_to_image_directory
from tasks.errors import UnreadableImageError
from tasks.evaluation.score import score_images
from tasks.predict.classifier import Classifier
from tests.helpers import COLOURS, write_class_folders


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_class_folders(tmp_path_factory.mktemp("photos"), 2, seed=9)


def test_predict_gives_the_probabilities_scoring_gives(trained_model, photos, tmp_path):
    paths = sorted(photos.rglob("*.png"))
    predictions = Classifier.load(trained_model).predict(paths)

    images = convert_to_image_directory(photos, tmp_path / "converted")
    table = score_images(ModelDirectory(trained_model), images, decode_on="cpu")
    by_source = {row["image"]: row for row in table.to_dict(orient="records")}
    for path, prediction in zip(paths, predictions):
        row = by_source[path.relative_to(photos).as_posix()]
        assert prediction.image == str(path) and prediction.label == row["Scored Labels"]
        scored = [row[f"Scored Probabilities_{name}"] for name in prediction.probabilities]
        assert np.allclose(list(prediction.probabilities.values()), scored, atol=1e-5)
    assert prediction.top(1)[0] == (prediction.label, max(prediction.probabilities.values()))
    assert ImageDirectory(tmp_path / "converted") and not (photos / "image_directory.json").exists()


def test_the_command_prints_each_photo_s_label_with_no_server(trained_model, photos, capsys, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    red = sorted((photos / "red").iterdir())[0]
    (expected,) = Classifier.load(trained_model).predict(red)  # the shared model is trained for 2 epochs only
    assert main(["predict", str(red), str(trained_model), "--top-k", "2"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"{red}: {expected.label}  ({expected.label} ") and line.count(",") == 1

    assert main(["predict", str(red), str(trained_model), "--json", "--top-k", "5"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["image"] == str(red) and row["label"] == expected.label == list(row["top"])[0]
    assert len(row["top"]) == len(COLOURS)


def test_a_missing_or_unreadable_photo_and_an_unknown_model_are_one_line(trained_model, tmp_path, capsys):
    notes = tmp_path / "notes.jpg"
    notes.write_text("not a photo")
    assert main(["predict", str(notes), str(trained_model)]) == 2
    assert (
        capsys.readouterr().err
        == f"image-classifier predict: error: {notes}: not an image Pillow can read (JPEG, PNG, WebP, HEIC, AVIF, …)\n"
    )
    assert main(["predict", str(tmp_path / "gone.jpg"), str(trained_model)]) == 2
    assert "gone.jpg: no such file" in capsys.readouterr().err
    assert main(["predict", str(notes), "no-such-model", "--registry", str(tmp_path / "registry")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("image-classifier predict: error: ") and err.count("\n") == 1
    with pytest.raises(UnreadableImageError):
        Classifier.load(trained_model).predict(notes)
    Image.new("RGB", (8, 8)).save(tmp_path / "fine.png")
    assert len(Classifier.load(trained_model).predict(tmp_path / "fine.png")) == 1
