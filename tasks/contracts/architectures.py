"""The torchvision classifiers a ModelSpec may name, one row per family: its names, where its classifier head
is, which ModelSpec options apply, and the input sizes it accepts.

Imports no torch: the model spec (and through it the Prefect form, the launcher and the registry) reads it.
``tests/contracts/test_architectures.py`` checks every name against ``torchvision.models.list_models`` and every
head path against the built network, so a model torchvision renames or restructures fails there.

Left out on purpose: SqueezeNet (its head is a 1x1 convolution, not a Linear), GoogLeNet and Inception v3
(auxiliary classifiers return a tuple while training; Inception also wants 299 px), vit_h_14 (torchvision's
ImageNet weights for it are for 518 px images, whose position embeddings do not fit the 224 px network its
builder makes without weights).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from tasks.errors import InvalidTrainingSetupError

FAMILY_OPTIONS = ("memory_efficient", "zero_init_residual")


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    # Dotted path (``nn.Module.get_submodule``) of the last Linear layer, the one replaced for the data's classes;
    # a number is a position in an nn.Sequential ("classifier.1": the Linear after the classifier's Dropout).
    head: str
    options: tuple[str, ...] = ()  # the FAMILY_OPTIONS this family's torchvision builder takes
    # The only input side the network accepts (ViT's position embeddings, MaxViT's window partition are built
    # for it); None: any side from min_image_size up.
    image_size: int | None = None
    # The smallest multiple of 8 px that runs (measured with torchvision 0.29, training mode, batch 2):
    # below it a pooling or convolution is left with an empty feature map.
    min_image_size: int = 16


FAMILIES = (
    # Azure ML designer's two modules first: its DenseNet and ResNet choices.
    Family(
        "DenseNet",
        ("densenet121", "densenet161", "densenet169", "densenet201"),
        head="classifier",
        options=("memory_efficient",),
        min_image_size=32,
    ),
    Family(
        "ResNet",
        (
            "resnet18",
            "resnet34",
            "resnet50",
            "resnet101",
            "resnet152",
            "resnext50_32x4d",
            "resnext101_32x8d",
            "resnext101_64x4d",
            "wide_resnet50_2",
            "wide_resnet101_2",
        ),
        head="fc",
        options=("zero_init_residual",),
    ),
    Family(
        "EfficientNet",
        tuple(f"efficientnet_b{i}" for i in range(8)) + ("efficientnet_v2_s", "efficientnet_v2_m", "efficientnet_v2_l"),
        head="classifier.1",
    ),
    Family(
        "ConvNeXt",
        ("convnext_tiny", "convnext_small", "convnext_base", "convnext_large"),
        head="classifier.2",
        min_image_size=32,
    ),
    Family("MobileNet v2", ("mobilenet_v2",), head="classifier.1"),
    # The first Linear of the v3 classifier (to 1280 features) belongs to the backbone; the last one is replaced.
    Family("MobileNet v3", ("mobilenet_v3_small", "mobilenet_v3_large"), head="classifier.3"),
    Family("MNASNet", ("mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3"), head="classifier.1"),
    Family(
        "RegNet",
        tuple(f"regnet_x_{size}" for size in ("400mf", "800mf", "1_6gf", "3_2gf", "8gf", "16gf", "32gf"))
        + tuple(f"regnet_y_{size}" for size in ("400mf", "800mf", "1_6gf", "3_2gf", "8gf", "16gf", "32gf", "128gf")),
        head="fc",
    ),
    Family(
        "ShuffleNet v2",
        ("shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5", "shufflenet_v2_x2_0"),
        head="fc",
    ),
    Family("Swin Transformer", ("swin_t", "swin_s", "swin_b", "swin_v2_t", "swin_v2_s", "swin_v2_b"), head="head"),
    Family(
        "Vision Transformer",
        ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32"),
        head="heads.head",
        image_size=224,
    ),
    Family("MaxViT", ("maxvit_t",), head="classifier.5", image_size=224),
    Family(
        "VGG",
        ("vgg11", "vgg11_bn", "vgg13", "vgg13_bn", "vgg16", "vgg16_bn", "vgg19", "vgg19_bn"),
        head="classifier.6",
        min_image_size=32,
    ),
    Family("AlexNet", ("alexnet",), head="classifier.6", min_image_size=64),
)

ARCHITECTURES = tuple(name for family in FAMILIES for name in family.architectures)
_FAMILY_OF = {name: family for family in FAMILIES for name in family.architectures}
DENSENETS = _FAMILY_OF["densenet121"].architectures
RESNETS = _FAMILY_OF["resnet18"].architectures


def family_of(architecture: str) -> Family:
    """The family row of a name from ARCHITECTURES (validated ModelSpecs hold no other)."""
    return _FAMILY_OF[architecture]


def unknown_architecture_message(name: object) -> str:
    """One line: what was given, the closest valid names, every valid name grouped by family."""
    close = difflib.get_close_matches(str(name).lower(), ARCHITECTURES, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    listing = "; ".join(f"{family.name}: {', '.join(family.architectures)}" for family in FAMILIES)
    return f"architecture {name!r} is not a torchvision classifier this pipeline builds{hint}. Valid: {listing}"


def option_error(architecture: str, options: dict[str, bool]) -> str | None:
    """Why a family option that is switched on does not apply to ``architecture``; None when all apply."""
    family = family_of(architecture)
    for option, enabled in options.items():
        if enabled and option not in family.options:
            takers = [f for f in FAMILIES if option in f.options]
            names = ", ".join(name for f in takers for name in f.architectures)
            return (
                f"{option} applies to the {' and '.join(f.name for f in takers)} family ({names}), "
                f"not to {architecture} ({family.name}): set {option} to false or choose one of those"
            )
    return None


def check_image_size(architecture: str, image_size: int | None) -> None:
    """Refuse an image_size parameter the network cannot take (None: chosen later, always one it can)."""
    family = family_of(architecture)
    if image_size is None:
        return
    if family.image_size is not None and image_size != family.image_size:
        raise InvalidTrainingSetupError(
            f"image_size is {image_size} but {architecture} ({family.name}) takes {family.image_size} px images "
            f"only: set image_size to {family.image_size} or leave it empty"
        )
    if image_size < family.min_image_size:
        raise InvalidTrainingSetupError(
            f"image_size is {image_size} but {architecture} ({family.name}) needs at least "
            f"{family.min_image_size} px: set image_size to {family.min_image_size} or more, or leave it empty"
        )


def input_size(architecture: str, requested: int | None, automatic: int) -> int:
    """The side images are resized to for ``architecture``: ``requested`` (the image_size parameter) when given
    (refused when the network cannot take it), else the family's fixed size, else ``automatic`` (chosen from the
    data) raised to the family's minimum."""
    check_image_size(architecture, requested)
    family = family_of(architecture)
    return requested or family.image_size or max(automatic, family.min_image_size)
