"""ONNX export checked by the real onnxruntime against PyTorch, and scoring through it."""

import json
import shutil

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ONNX_FILE, WEIGHTS_FILE, ModelDirectory
from tasks.errors import InvalidModelDirectoryError, OnnxMismatchError
from tasks.evaluation.onnx_export import ONNX_TOLERANCE, check_onnx, export_onnx, sample_inputs
from tasks.evaluation.score import score_images


@pytest.fixture(scope="module")
def unsure_model(trained_model, tmp_path_factory) -> ModelDirectory:
    """The trained model with its head scaled down: probabilities spread out instead of 0 and 1, so that
    comparing them tests something."""
    folder = shutil.copytree(
        trained_model, tmp_path_factory.mktemp("onnx") / "model", ignore=shutil.ignore_patterns("checkpoints")
    )
    state = torch.load(folder / WEIGHTS_FILE, weights_only=True)
    torch.save({**state, "fc.weight": state["fc.weight"] / 200}, folder / WEIGHTS_FILE)
    return export_onnx(ModelDirectory(folder))


def test_export_has_a_dynamic_batch_and_matches_pytorch(unsure_model, colour_image_dirs):
    validation = ImageDirectory(colour_image_dirs[1])
    worst = check_onnx(unsure_model, validation)
    print(f"largest ONNX - PyTorch probability difference: {worst:.2e}")
    assert worst <= ONNX_TOLERANCE

    session = onnxruntime.InferenceSession(str(unsure_model.root / ONNX_FILE), providers=["CPUExecutionProvider"])
    (probabilities,) = session.run(None, {"images": sample_inputs(unsure_model, validation, 7).numpy()})
    assert probabilities.shape == (7, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert (probabilities.max(axis=1) < 0.99).any(), "the check ran on probabilities that are not all 0 or 1"


def test_the_onnx_file_carries_its_contract(unsure_model):
    session = onnxruntime.InferenceSession(str(unsure_model.root / ONNX_FILE), providers=["CPUExecutionProvider"])
    contract = session.get_modelmeta().custom_metadata_map
    assert json.loads(contract["classes"]) == ["blue", "green", "red"] == unsure_model.classes
    size = int(contract["image_size"])
    assert size == unsure_model.spec.image_size and session.get_inputs()[0].shape[1:] == [3, size, size]
    assert json.loads(contract["mean"]) == pytest.approx([0.485, 0.456, 0.406])
    assert json.loads(contract["std"]) == pytest.approx([0.229, 0.224, 0.225])
    assert contract["input"] == session.get_inputs()[0].name == "images"
    assert "(x - mean) / std" in contract["preprocessing"]
    stored = {p.key: p.value for p in onnx.load(unsure_model.root / ONNX_FILE, load_external_data=False).metadata_props}
    assert stored == contract, "the same props read with the onnx package"


def test_scoring_through_onnx_gives_the_torch_table(unsure_model, colour_image_dirs):
    images = ImageDirectory(colour_image_dirs[1])
    by_torch = score_images(unsure_model, images, batch_size=5)
    by_onnx = score_images(unsure_model, images, batch_size=5, runtime="onnx")
    assert (
        list(by_onnx.columns) == list(by_torch.columns)
        and (by_onnx["Scored Labels"] == by_torch["Scored Labels"]).all()
    )
    columns = [c for c in by_torch.columns if c.startswith("Scored Probabilities_")]
    np.testing.assert_allclose(by_onnx[columns].to_numpy(), by_torch[columns].to_numpy(), atol=ONNX_TOLERANCE)


def test_an_onnx_file_that_no_longer_matches_the_weights_fails_the_check(unsure_model, tmp_path):
    changed = shutil.copytree(unsure_model.root, tmp_path / "changed")
    state = torch.load(changed / WEIGHTS_FILE, weights_only=True)
    torch.save({**state, "fc.bias": state["fc.bias"] + torch.tensor([0.0, 0.01, 0.0])}, changed / WEIGHTS_FILE)
    with pytest.raises(OnnxMismatchError, match="differs from PyTorch by up to"):
        check_onnx(ModelDirectory(changed))


def test_onnx_runtime_needs_an_exported_model(trained_model, colour_image_dirs):
    with pytest.raises(InvalidModelDirectoryError, match="has no model.onnx"):
        score_images(ModelDirectory(trained_model), ImageDirectory(colour_image_dirs[1]), runtime="onnx")
