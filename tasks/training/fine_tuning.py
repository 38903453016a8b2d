"""Fine-tuning modes (PyTorch's transfer-learning tutorial): train every layer, optionally the backbone at a lower
rate, or keep the backbone as a fixed feature extractor and train the new head alone.

The head is the Linear layer build_network puts in for the data's classes (tasks/contracts/architectures.py says where).
"""

from __future__ import annotations

from torch import nn

from tasks.contracts.training_config import TrainingParams
from tasks.vision.networks import backbone_modules, split_head_and_backbone


def parameter_groups(model: nn.Module, architecture: str, learning_rate: float, params: TrainingParams) -> list[dict]:
    """The optimizer's parameter groups, the head's first (its rate is the one logged as the learning rate).

    "all" with backbone_lr_factor 1 is one group of every parameter in ``model.parameters()`` order: the
    optimizer, its update and its checkpoint are exactly those of training without fine-tuning options.
    A second group carries ``lr_factor``, so that a schedule rescaled on resume keeps the backbone's ratio.
    """
    head, backbone = split_head_and_backbone(model, architecture)
    if params.fine_tuning == "head":
        return [{"params": head}]
    if params.backbone_lr_factor == 1.0:
        return [{"params": list(model.parameters())}]
    factor = params.backbone_lr_factor
    return [{"params": head}, {"params": backbone, "lr": learning_rate * factor, "lr_factor": factor}]


def freeze_backbone(model: nn.Module, architecture: str) -> list[nn.Module]:
    """Head-only training: the backbone's parameters stop taking gradients (and DistributedDataParallel, built
    after this, leaves them out of its all-reduce). Returns the backbone's modules, which the training loop
    puts back into eval mode after every ``model.train()``.

    Eval mode matters as much as the frozen weights: in training mode BatchNorm would still move its running
    statistics towards this data (changing what the backbone computes, and what scoring sees, with no gradient
    involved), and dropout or stochastic depth would feed the head features that scoring never produces. In eval
    mode the head learns from exactly the features the network computes at scoring time. The dropout just
    before some heads (EfficientNet's, MobileNet's) sits outside the new Linear, so it is frozen too.
    """
    _, backbone = split_head_and_backbone(model, architecture)
    for parameter in backbone:
        parameter.requires_grad_(False)
    return backbone_modules(model, architecture)
