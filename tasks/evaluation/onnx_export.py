"""ONNX export of a trained ModelDirectory: ``model.onnx`` beside ``model.pt``, checked with onnxruntime.

The graph takes ``images`` (N x 3 x size x size, normalised as ``model_spec.json`` says) and returns
``probabilities`` (N x classes, softmax included), with N free. It is exported with the TorchScript-based
exporter (``dynamo=False`` + ``dynamic_axes``): it works the same from torch 2.4 to today without
``onnxscript``, and a torchvision classifier has no data-dependent control flow that would need
``torch.export``. The check runs both runtimes on the same inputs, at two batch sizes, and fails on any
probability more than ``ONNX_TOLERANCE`` apart.

The file carries its contract in ``metadata_props`` (``onnx_contract``), so a client needs nothing else:
``classes`` (JSON list, index = output column), ``image_size``, ``mean`` and ``std`` (JSON lists, RGB),
``preprocessing`` (in words) and the input and output names. onnxruntime reads them back as
``InferenceSession(...).get_modelmeta().custom_metadata_map``.
"""

from __future__ import annotations

import io
import json
import warnings

import numpy as np
import onnx
import torch
from torch import nn

from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ONNX_FILE, ModelDirectory
from tasks.errors import OnnxMismatchError
from tasks.inference.networks import INPUT_NAME, OnnxNetwork
from tasks.inference.networks import PROBABILITIES_NAME as OUTPUT_NAME
from tasks.storage.local_files import atomic_write
from tasks.vision.images import ImageFiles
from tasks.vision.networks import load_trained_model
from tasks.vision.transforms import eval_transform

ONNX_TOLERANCE = 1e-4
OPSET = 17
CHECK_BATCH_SIZES = (1, 5)


class _WithSoftmax(nn.Module):
    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.network(images), dim=1)


def probability_model(model_dir: ModelDirectory) -> nn.Module:
    """The trained network with its softmax, on CPU, in eval mode: what the ONNX file holds."""
    return _WithSoftmax(load_trained_model(model_dir, "cpu")).eval()


def onnx_contract(model_dir: ModelDirectory) -> dict[str, str]:
    """What a client needs to use ``model.onnx``: the metadata written into it (ONNX metadata values are strings)."""
    spec = model_dir.spec
    return {
        "classes": json.dumps(model_dir.classes),
        "image_size": str(spec.image_size),
        "mean": json.dumps(list(spec.mean)),
        "std": json.dumps(list(spec.std)),
        "preprocessing": f"RGB, {spec.transformations.for_inference().describe(spec.image_size)}, scaled to [0, 1], "
        "then (x - mean) / std per channel; N x 3 x H x W float32",
        "input": INPUT_NAME,
        "output": f"{OUTPUT_NAME} (softmax, one column per class)",
    }


def export_onnx(model_dir: ModelDirectory) -> ModelDirectory:
    """Write ``model.onnx`` into the ModelDirectory (atomically), its contract in its metadata."""
    size = model_dir.spec.transformations.decoded_side(model_dir.spec.image_size)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # torch >= 2.9 warns that this exporter is legacy; it is chosen on purpose (see the module docstring).
        warnings.filterwarnings("ignore", message=".*TorchScript-based ONNX export", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message="The feature will be removed", category=DeprecationWarning)
        torch.onnx.export(
            probability_model(model_dir),
            (torch.zeros(2, 3, size, size),),
            buffer,
            dynamo=False,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            opset_version=OPSET,
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
        )
    graph = onnx.load_from_string(buffer.getvalue())
    onnx.helper.set_model_props(graph, onnx_contract(model_dir))
    with atomic_write(model_dir.root / ONNX_FILE, "wb") as handle:
        handle.write(graph.SerializeToString())
    return model_dir


def sample_inputs(model_dir: ModelDirectory, images: ImageDirectory | None, count: int) -> torch.Tensor:
    """``count`` real images from ``images`` (repeated if fewer), or seeded noise when none are given."""
    spec = model_dir.spec
    if images is None or len(images) == 0:
        side = spec.transformations.decoded_side(spec.image_size)
        return torch.randn(count, 3, side, side, generator=torch.Generator().manual_seed(0))
    dataset = ImageFiles(images.samples(), eval_transform(spec.transformations, spec.image_size, spec.mean, spec.std))
    return torch.stack([dataset[i % len(dataset)][0] for i in range(count)])


def check_onnx(
    model_dir: ModelDirectory, images: ImageDirectory | None = None, tolerance: float = ONNX_TOLERANCE
) -> float:
    """The largest absolute difference between ONNX and PyTorch probabilities; raises past ``tolerance``."""
    session, network = OnnxNetwork.exported(model_dir).session, probability_model(model_dir)
    worst = 0.0
    for batch_size in CHECK_BATCH_SIZES:
        inputs = sample_inputs(model_dir, images, batch_size)
        with torch.inference_mode():
            expected = network(inputs).numpy()
        (produced,) = session.run([OUTPUT_NAME], {INPUT_NAME: inputs.numpy()})
        if produced.shape != expected.shape:
            raise OnnxMismatchError(
                f"{ONNX_FILE} returned shape {produced.shape} for a batch of {batch_size}, PyTorch {expected.shape}"
            )
        worst = max(worst, float(np.abs(produced - expected).max()))
    if worst > tolerance:
        raise OnnxMismatchError(
            f"{model_dir.root / ONNX_FILE} differs from PyTorch by up to {worst:.2e} in probability "
            f"(allowed: {tolerance:.0e}); the export is not used"
        )
    return worst
