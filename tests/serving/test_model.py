"""tasks/serving/model.py: a served version on int8 says so in its identity, and recording never fails a batch
(a folder it cannot write drops the records, counted)."""

import shutil
from pathlib import Path

import numpy as np

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.inference.int8 import int8_unavailable
from tasks.monitoring.recorder import Recorder, RecordSettings
from tasks.serving.model import ServedModel, locate


def test_int8_is_served_and_named_and_an_unwritable_record_folder_fails_no_batch(
    trained_model, colour_image_dirs, tmp_path
):
    model_dir = Path(shutil.copytree(trained_model, tmp_path / "model"))
    validation = ImageDirectory(colour_image_dirs[1])
    images = [Path(path).read_bytes() for path, _ in validation.samples()][:6]
    _, identity = locate(str(model_dir), "registry", tmp_path / "cache", "torch", "int8")
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    dropped = []
    recorder = Recorder(RecordSettings(str(blocked), segment_records=1), on_drop=dropped.append)
    served = ServedModel(
        ModelDirectory(model_dir), identity, max_pixels=10**6, calibration=str(validation.root), recorder=recorder
    )
    assert served.identity.precision == ("fp32" if int8_unavailable() else "int8")

    results = served.run([(data, f"image {i}") for i, data in enumerate(images)])
    recorder.close()
    assert all(isinstance(row, np.ndarray) and np.isclose(row.sum(), 1, atol=1e-4) for row in results)
    assert len(dropped) == len(images) and recorder.dropped["not written"] == len(images)
