"""What a loaded model runs a normalised batch through: the trained network in PyTorch (split at its head, so one
pass gives the penultimate-layer embeddings and the logits), or an ONNX Runtime session (``model.onnx``, or the int8
model of ``tasks/inference/int8.py``). Imports no Prefect."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from tasks.contracts.architectures import family_of
from tasks.contracts.model_directory import ONNX_FILE, ModelDirectory
from tasks.errors import InvalidModelDirectoryError
from tasks.vision.networks import load_trained_model, memory_format

logger = logging.getLogger("tasks.inference")

# The names of the ONNX graphs' inputs and outputs: model.onnx gives probabilities, the int8 graph logits and
# embeddings.
INPUT_NAME, PROBABILITIES_NAME, LOGITS_NAME, EMBEDDINGS_NAME = "images", "probabilities", "logits", "embeddings"


class Outputs(NamedTuple):
    """A batch's outputs on the host or its device: ``probabilities`` when the network gives them itself (model.onnx
    holds its softmax), else ``logits``; ``embeddings`` (N, features) when the network gives them."""

    logits: torch.Tensor | None
    probabilities: torch.Tensor | None
    embeddings: torch.Tensor | None


class SplitNetwork(nn.Module):
    """The trained network as backbone and head: ``forward`` returns (logits, embeddings), the embeddings being what
    the head is given (the penultimate layer), in one pass."""

    def __init__(self, network: nn.Module, architecture: str) -> None:
        super().__init__()
        head_path = family_of(architecture).head
        self.head = network.get_submodule(head_path)
        network.set_submodule(head_path, nn.Identity())
        self.backbone = network

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embeddings = self.backbone(images)
        return self.head(embeddings), embeddings


def split_network(model_dir: ModelDirectory, device: torch.device) -> SplitNetwork:
    return SplitNetwork(load_trained_model(model_dir, device), model_dir.spec.architecture).eval()


def without_the_gil(network: nn.Module, side: int) -> nn.Module:
    """The network traced (TorchScript): one call runs every layer in C++ without taking Python's GIL between
    them, the same kernels in the same order (the logits equal eager's to the bit). In the endpoint's process the
    event loop holds the GIL while it reads requests and writes answers; an eager forward pass takes it back at every
    layer and waited: 2,007 vs 382 ms for a batch of 16 beside a busy Python thread, traced 1,181 ms
    (BENCHMARKS.md, serving). A network that cannot be traced runs eager."""
    example = torch.zeros((1, 3, side, side))
    try:
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # torch.jit's deprecation notice
            return torch.jit.trace(network, example, check_trace=False)
    except Exception as error:  # noqa: BLE001 (a network with data-dependent control flow)
        logger.warning("run eager: the network could not be traced (%s: %s)", type(error).__name__, error)
        return network


class TorchNetwork:
    """The trained network in PyTorch on ``device``: traced on the CPU (``without_the_gil``), eager on a GPU (cuDNN's
    kernels, channels-last); ``bf16`` runs it under bf16 autocast."""

    def __init__(self, model_dir: ModelDirectory, device: torch.device, side: int, bf16: bool = False) -> None:
        self.device, self.bf16 = device, bf16
        network = split_network(model_dir, device).to(memory_format=memory_format(device))
        self.network = without_the_gil(network, side) if device.type == "cpu" and not bf16 else network

    def __call__(self, batch: torch.Tensor) -> Outputs:
        batch = batch.contiguous(memory_format=memory_format(self.device))
        with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            logits, embeddings = self.network(batch)
        return Outputs(logits, None, embeddings)


def onnx_session(path: Path, threads: int | None = None):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxNetwork:
    """An ONNX Runtime session on the CPU: ``model.onnx`` (probabilities) or the int8 graph (logits, embeddings)."""

    device = torch.device("cpu")

    def __init__(self, path: Path, threads: int | None = None) -> None:
        self.session = onnx_session(path, threads)
        self.outputs = [output.name for output in self.session.get_outputs()]

    @classmethod
    def exported(cls, model_dir: ModelDirectory, threads: int | None = None) -> OnnxNetwork:
        path = model_dir.root / ONNX_FILE
        if not path.is_file():
            raise InvalidModelDirectoryError(
                f"{model_dir.root} has no {ONNX_FILE}: use runtime 'torch', or train with export_onnx=True "
                "(tasks.evaluation.onnx_export.export_onnx for a ModelDirectory of your own)"
            )
        return cls(path, threads)

    def __call__(self, batch: torch.Tensor) -> Outputs:
        found = dict(zip(self.outputs, self.session.run(self.outputs, {INPUT_NAME: batch.numpy()}), strict=True))
        as_tensor = lambda name: torch.from_numpy(found[name]) if name in found else None  # noqa: E731
        return Outputs(as_tensor(LOGITS_NAME), as_tensor(PROBABILITIES_NAME), as_tensor(EMBEDDINGS_NAME))


def probabilities_of(outputs: Outputs) -> torch.Tensor:
    """The one softmax of every inference path (float32, rows summing to 1)."""
    if outputs.probabilities is not None:
        return outputs.probabilities
    return torch.softmax(outputs.logits.float(), dim=1)


def most_probable(probabilities: np.ndarray, k: int) -> np.ndarray:
    """The column indexes of each row's ``k`` most probable classes, most probable first; of equal probabilities the
    class listed first ranks first (as argmax picks it)."""
    return np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
