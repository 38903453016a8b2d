"""tasks/inference/loaded.py: the one loaded model. Every unreadable image is the same typed error whatever the
caller gave (a path or bytes); one pass gives probabilities and the embeddings they come from; a choice the device
cannot run is one line."""

import io

import numpy as np
import pytest
import torch
from PIL import Image

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory
from tasks.errors import PipelineInputError, UnreadableImageError
from tasks.inference.loaded import LoadedModel
from tasks.vision.networks import load_trained_model


@pytest.fixture(scope="module")
def model(trained_model):
    return LoadedModel(ModelDirectory(trained_model), max_pixels=10_000)


def png(side: int) -> bytes:
    encoded = io.BytesIO()
    Image.new("RGB", (side, side), "red").save(encoded, format="PNG")
    return encoded.getvalue()


@pytest.mark.parametrize(
    ("given", "status", "reason"),
    [
        (b"", 400, "empty: no image bytes"),
        (b"plain text, not a photo", 400, "not an image Pillow can read"),
        (png(32)[:60], 400, "damaged or truncated image"),
        (png(101), 413, "101 x 101 = 10,201 pixels, more than the 10,000 allowed"),
    ],
    ids=["empty", "not-an-image", "truncated", "too-many-pixels"],
)
def test_an_unreadable_image_is_one_typed_error_from_bytes_and_from_a_file(model, tmp_path, given, status, reason):
    with pytest.raises(UnreadableImageError) as from_bytes:
        model.decode(given, "upload")
    assert (from_bytes.value.part, from_bytes.value.status) == ("upload", status)
    assert from_bytes.value.reason.startswith(reason) and str(from_bytes.value).startswith(f"upload: {reason}")
    path = tmp_path / "photo.png"
    path.write_bytes(given)
    if given:  # an empty file is not an image either
        with pytest.raises(UnreadableImageError, match=reason) as from_file:
            model.decode(path)
        assert from_file.value.part == str(path) and from_file.value.status == status
    with pytest.raises(UnreadableImageError, match="no such file"):
        model.decode(tmp_path / "gone.png")


def test_one_pass_gives_the_probabilities_of_the_trained_network_and_its_embeddings(
    model, trained_model, colour_image_dirs
):
    images = ImageDirectory(colour_image_dirs[1])
    batch = [model.decode(path) for path, _ in list(images.samples())[:6]]
    probabilities, embeddings = model.probabilities(batch), model.embeddings(batch)

    network = load_trained_model(ModelDirectory(trained_model))
    with torch.inference_mode():
        eager = torch.softmax(network(model.batch(batch)), dim=1).numpy()
    assert probabilities.shape == (6, len(model.classes)) and np.allclose(probabilities, eager, atol=1e-6)
    assert embeddings.shape == (6, network.fc.in_features)
    with torch.inference_mode():  # the embeddings are what the head is given
        again = torch.softmax(network.fc(torch.from_numpy(embeddings)), dim=1).numpy()
    assert np.allclose(again, probabilities, atol=1e-6)


def test_choices_a_device_cannot_run_are_one_line(trained_model):
    model_dir = ModelDirectory(trained_model)
    for options, message in [
        ({"runtime": "tensorrt"}, "runtime 'tensorrt' is not one of torch, onnx"),
        ({"precision": "fp8"}, "precision 'fp8' is not one of fp32, bf16, int8"),
        ({"runtime": "onnx", "precision": "int8"}, "runtime 'onnx' runs model.onnx as exported"),
        ({"precision": "int8", "device": "meta"}, "precision 'int8' runs on the CPU"),
    ]:
        with pytest.raises(PipelineInputError, match=message):
            LoadedModel(model_dir, **options)
