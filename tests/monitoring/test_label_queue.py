"""tasks/monitoring/label_queue.py: the recorded images the real model was least sure of, each once, exported as a
folder per predicted class and a CSV, from the command line, and with --unlike those farthest from the reference;
what cannot be queued is one line and exit 2."""

import io

import pandas as pd
from PIL import Image

from flows.cli import main
from tasks.inference.loaded import LoadedModel
from tests.helpers import NAME
from tests.monitoring.answers import answer, photos, publish


def test_the_least_sure_recorded_images_are_queued_once_each_by_predicted_class(watched, tmp_path, capsys):
    model = LoadedModel.load(f"{NAME}/1", str(watched))
    images = photos(6) + photos(3, grey=True, size=20)
    records = answer(model, images)
    for i, record in enumerate(records):  # confidences of our own, to know the order the queue must keep
        record["confidence"] = round(0.95 - 0.1 * i, 2)
    records[8]["confidence"] = 0.99  # the last image is answered twice: queued once, with its least sure answer
    again = {**records[8], "confidence": 0.05, "time": "2026-11-29T12:05:00+00:00"}
    folder = str(tmp_path / "records")
    publish(folder, records[:7] + [records[8]], images[:7] + [images[8]])
    publish(folder, [records[7]], sequence=2)  # its image not kept: not queued
    publish(folder, [again], [images[8]], sequence=3)

    out = tmp_path / "to-label"
    argv = ["label-queue", NAME, "--records", folder, "--out", str(out), "--count", "4"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"4 images queued in {out} (")
    table = pd.read_csv(out / "queue.csv")
    assert list(table.columns) == ["sha256", "predicted label", "confidence", "time", "file", "why"]
    assert table["confidence"].tolist() == [0.05, 0.35, 0.45, 0.55]  # images 8, 6, 5, 4
    assert table["sha256"].is_unique and table["sha256"][0] == again["sha256"]
    for row in table.itertuples():
        assert row.file.split("/")[0] == row._2  # the predicted label's folder
        with Image.open(io.BytesIO((out / row.file).read_bytes())) as image:
            assert image.format == "PNG" and row.file.endswith(".png")

    unlike = tmp_path / "unlike"
    argv_unlike = [*argv[:4], "--out", str(unlike), "--count", "1", "--unlike", "1", "--registry", str(watched)]
    assert main(argv_unlike) == 0
    capsys.readouterr()
    queued = pd.read_csv(unlike / "queue.csv")
    assert queued["why"].tolist() == ["least sure", "unlike the reference"]
    assert queued["sha256"].tolist() == [again["sha256"], records[6]["sha256"]]  # the other grey, larger one

    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {out} already holds files: give a new or empty folder for the queue\n"
    (tmp_path / "records" / again["image"]).unlink()  # a recorded image gone: said, not a traceback
    assert main([*argv[:4], "--out", str(tmp_path / "gone")]) == 2
    assert capsys.readouterr().err == f"error: {folder}/{again['image']}: the recorded image is missing\n"
    assert main(["label-queue", "cats", "--records", folder, "--out", str(tmp_path / "empty")]) == 2
    assert "holds 0 records of cats, 0 with their image: nothing to queue" in capsys.readouterr().err
