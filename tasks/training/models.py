"""Build torchvision classifiers from a ModelSpec."""

from __future__ import annotations

import torch
import torchvision
from torch import nn

from tasks.model_directory import DENSENETS, ModelDirectory, ModelSpec


def build_model(spec: ModelSpec, num_classes: int) -> nn.Module:
    """A torchvision model for ``spec`` whose classifier head has ``num_classes`` outputs.

    Pretrained ImageNet weights are read from ``spec.weights_path`` (never downloaded) before the head is replaced.
    """
    family_option = (
        {"memory_efficient": spec.memory_efficient}
        if spec.architecture in DENSENETS
        else {"zero_init_residual": spec.zero_init_residual}
    )
    model = torchvision.models.get_model(spec.architecture, weights=None, **family_option)
    if spec.pretrained:
        model.load_state_dict(torch.load(spec.weights_path, map_location="cpu", weights_only=True))
    head_name = "classifier" if spec.architecture in DENSENETS else "fc"
    head = getattr(model, head_name)
    setattr(model, head_name, nn.Linear(head.in_features, num_classes))
    return model


def load_trained_model(model_dir: ModelDirectory, device: torch.device | str = "cpu") -> nn.Module:
    """The trained network of a ModelDirectory, in eval mode."""
    spec = model_dir.spec.model_copy(update={"pretrained": False})
    model = build_model(spec, spec.num_classes)
    model.load_state_dict(torch.load(model_dir.weights_path, map_location="cpu", weights_only=True))
    return model.to(device).eval()
