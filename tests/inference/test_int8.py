"""tasks/inference/int8.py: int8 is calibrated once, kept beside the model with its sha256, made again when it no
longer matches, agrees with fp32, and is used only where the CPU makes it pay."""

import json
import shutil

import numpy as np
import pytest

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.errors import PipelineInputError
from tasks.inference.int8 import INT8_FILE, INT8_RECORD, int8_unavailable
from tasks.inference.loaded import LoadedModel


def test_int8_is_calibrated_once_kept_beside_the_model_and_agrees_with_fp32(trained_model, colour_image_dirs, tmp_path):
    if int8_unavailable() is not None:
        pytest.skip(f"int8 does not pay on this CPU: {int8_unavailable()}")
    model_dir = ModelDirectory(shutil.copytree(trained_model, tmp_path / "model"))
    validation = ImageDirectory(colour_image_dirs[1])
    with pytest.raises(PipelineInputError, match="calibrated on its validation images: give calibration"):
        LoadedModel(model_dir, precision="int8")

    int8 = LoadedModel(model_dir, precision="int8", calibration=validation)
    record = json.loads((model_dir.root / INT8_RECORD).read_text())
    assert int8.precision == "int8" and record["calibration"]["images"] == len(validation)
    fp32 = LoadedModel(model_dir)
    batch = [fp32.decode(path) for path, _ in validation.samples()]
    expected, got = fp32.probabilities(batch), int8.probabilities(batch)
    assert (got.argmax(axis=1) == expected.argmax(axis=1)).all() and np.abs(got - expected).max() < 0.05
    assert int8.embeddings(batch).shape == fp32.embeddings(batch).shape

    made = (model_dir.root / INT8_FILE).stat().st_mtime_ns
    assert LoadedModel(model_dir, precision="int8").precision == "int8"  # kept: no calibration needed
    assert (model_dir.root / INT8_FILE).stat().st_mtime_ns == made
    (model_dir.root / INT8_FILE).write_bytes(b"tampered")
    with pytest.raises(PipelineInputError, match="give calibration"):  # no longer matches its record: made again
        LoadedModel(model_dir, precision="int8")


@pytest.mark.parametrize(
    ("machine", "flags", "pays"),
    [
        ("x86_64", {"avx2", "avx512_vnni"}, True),
        ("x86_64", {"sse4_2"}, False),
        ("aarch64", {"asimddp"}, True),
        ("aarch64", {"asimd"}, False),
        ("riscv64", set(), False),
    ],
)
def test_int8_is_used_only_where_the_cpu_makes_it_pay(machine, flags, pays):
    assert (int8_unavailable(flags, machine) is None) == pays
