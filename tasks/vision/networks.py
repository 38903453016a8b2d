"""torchvision classifiers from a ModelSpec (any family of tasks/architectures.py); ImageNet weights come from local
files only."""

from __future__ import annotations

import re
from pathlib import Path

import torch
import torchvision
from torch import nn

from tasks.architectures import family_of
from tasks.errors import InvalidModelDirectoryError
from tasks.model_directory import DENSENETS, ModelDirectory, ModelSpec

# torchvision's published DenseNet files predate its layer names ("norm.1" is now "norm1").
_OLD_DENSENET_KEY = re.compile(
    r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var|num_batches_tracked))$"
)


def memory_format(device: torch.device) -> torch.memory_format:
    """channels_last on CUDA, where cuDNN's NHWC kernels (with bf16) are the fast path; contiguous on CPU,
    where channels_last measured 0.85x on this project's 2-core AMD EPYC runs (ResNet-18, 32 px, batch 16)."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


def pretrained_weights_file(spec: ModelSpec) -> Path:
    """The local file with ImageNet weights for ``spec``: ``weights_path``, or torchvision's file in torch's cache.

    Nothing is downloaded: a missing file is an error that says where to put it.
    """
    if spec.weights_path:
        path = Path(spec.weights_path)
        if not path.is_file():
            raise InvalidModelDirectoryError(f"weights_path {path} for {spec.architecture} does not exist")
        return path
    file_name = torchvision.models.get_model_weights(spec.architecture).DEFAULT.url.rsplit("/", 1)[-1]
    cached = Path(torch.hub.get_dir()) / "checkpoints" / file_name
    if not cached.is_file():
        raise InvalidModelDirectoryError(
            f"pretrained {spec.architecture} needs ImageNet weights, and nothing is downloaded at run time: "
            f"put torchvision's {file_name} at {cached} (torch's cache; TORCH_HOME moves it), "
            "or set weights_path to a local copy, or set pretrained to false"
        )
    return cached


def load_pretrained(model: nn.Module, spec: ModelSpec) -> None:
    path = pretrained_weights_file(spec)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise InvalidModelDirectoryError(f"{path} is not a readable PyTorch state dict: {error}") from error
    if spec.architecture in DENSENETS:
        state = {_OLD_DENSENET_KEY.sub(r"\1\2", key): value for key, value in state.items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        detail = str(error) if len(str(error)) < 600 else str(error)[:600] + " …"
        raise InvalidModelDirectoryError(f"the weights in {path} do not fit {spec.architecture}: {detail}") from error


def build_network(spec: ModelSpec, num_classes: int) -> nn.Module:
    """A torchvision model for ``spec`` whose classifier head has ``num_classes`` outputs.

    Pretrained ImageNet weights are loaded (from a local file) before the head is replaced.
    """
    family_option = {option: getattr(spec, option) for option in family_of(spec.architecture).options}
    model = torchvision.models.get_model(spec.architecture, weights=None, **family_option)
    if spec.pretrained:
        load_pretrained(model, spec)
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
    spec = model_dir.spec.model_copy(update={"pretrained": False})
    model = build_network(spec, spec.num_classes)
    model_dir.load_weights_into(model)
    return model.to(device).eval()
