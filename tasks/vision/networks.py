"""torchvision classifiers from a ModelSpec (any family of tasks/contracts/architectures.py), from scratch or from checked
pretrained weights; where their classifier head is."""

from __future__ import annotations

from pathlib import Path

import torch
import torchvision
from torch import nn

from tasks.contracts.architectures import family_of
from tasks.contracts.model_directory import ModelDirectory, ModelSpec
from tasks.vision.weights import load_weights


def memory_format(device: torch.device) -> torch.memory_format:
    """channels_last on CUDA, where cuDNN's NHWC kernels (with bf16) are the fast path; contiguous on CPU,
    where channels_last measured slower (BENCHMARKS.md)."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


def build_network(spec: ModelSpec, num_classes: int, weights_file: Path | None = None) -> nn.Module:
    """A torchvision model for ``spec`` whose classifier head has ``num_classes`` outputs.

    ``weights_file`` (pretrained weights, checked by ``tasks.vision.weights``) is loaded before the head is replaced.
    """
    family_option = {option: getattr(spec, option) for option in family_of(spec.architecture).options}
    model = torchvision.models.get_model(spec.architecture, weights=None, **family_option)
    if weights_file is not None:
        load_weights(model, weights_file, spec.architecture)
    head_path = family_of(spec.architecture).head
    model.set_submodule(head_path, nn.Linear(model.get_submodule(head_path).in_features, num_classes))
    return model


def head_module(model: nn.Module, architecture: str) -> nn.Module:
    """The classifier head (the Linear layer build_network put in for the data's classes)."""
    return model.get_submodule(family_of(architecture).head)


def split_head_and_backbone(model: nn.Module, architecture: str) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the head's parameters, every other parameter: the backbone's), each in ``model.parameters()`` order."""
    head = {id(parameter) for parameter in head_module(model, architecture).parameters()}
    parameters = list(model.parameters())
    return [p for p in parameters if id(p) in head], [p for p in parameters if id(p) not in head]


def backbone_modules(model: nn.Module, architecture: str) -> list[nn.Module]:
    """The modules outside the head that hold no part of it: setting them to eval mode freezes the backbone's
    behaviour (BatchNorm statistics, dropout, stochastic depth) while the head trains."""
    head_path = family_of(architecture).head
    on_the_way = {""} | {head_path.rsplit(".", i)[0] for i in range(1, head_path.count(".") + 1)}
    return [
        module
        for name, module in model.named_modules()
        if name not in on_the_way and name != head_path and not name.startswith(head_path + ".")
    ]


def load_trained_model(model_dir: ModelDirectory, device: torch.device | str = "cpu") -> nn.Module:
    """The trained network of a ModelDirectory, in eval mode."""
    model = build_network(model_dir.spec, model_dir.spec.num_classes)
    model_dir.load_weights_into(model)
    return model.to(device).eval()
