"""The family table against torchvision itself: names, heads, input sizes; one network of each newer family
built, trained a step and exported to ONNX."""

import json

import pytest
import torch
import torchvision
from pydantic import ValidationError
from torch import nn

from tasks.contracts.architectures import ARCHITECTURES, DENSENETS, FAMILIES, RESNETS, family_of, input_size
from tasks.contracts.model_directory import CLASSES_FILE, WEIGHTS_FILE, ModelDirectory, ModelSpec, TrainedModelSpec
from tasks.errors import InvalidTrainingSetupError
from tasks.evaluation.onnx_export import ONNX_TOLERANCE, check_onnx, export_onnx
from tasks.vision.networks import build_network, head_module

# torchvision classifiers the table leaves out, and why (tasks/contracts/architectures.py's docstring).
LEFT_OUT = {"squeezenet1_0", "squeezenet1_1", "googlenet", "inception_v3", "vit_h_14"}


def test_the_table_names_every_torchvision_classifier_but_the_ones_left_out():
    torchvisions = set(torchvision.models.list_models(module=torchvision.models))
    assert len(ARCHITECTURES) == len(set(ARCHITECTURES)), "a name in two families"
    assert set(ARCHITECTURES) - torchvisions == set(), "names torchvision does not have (renamed, removed?)"
    assert torchvisions - set(ARCHITECTURES) == LEFT_OUT, "torchvision has new classifiers: add them to the table"


def test_an_unknown_architecture_is_refused_with_the_valid_names_by_family():
    with pytest.raises(ValidationError) as error:
        ModelSpec(architecture="resnet19")
    message = str(error.value)
    assert "architecture 'resnet19' is not a torchvision classifier" in message
    assert "did you mean resnet18" in message
    for family in FAMILIES:
        assert f"{family.name}: {', '.join(family.architectures)}" in message
    assert ModelSpec(architecture="vit_b_16").architecture == "vit_b_16"


def test_family_options_apply_to_their_families_only():
    with pytest.raises(
        ValidationError, match=r"zero_init_residual applies to the ResNet family \(resnet18, .*convnext"
    ):
        ModelSpec(architecture="convnext_tiny", zero_init_residual=True)
    with pytest.raises(ValidationError, match="memory_efficient applies to the DenseNet family"):
        ModelSpec(architecture="resnet18", memory_efficient=True)
    assert ModelSpec(architecture="wide_resnet50_2", zero_init_residual=True).zero_init_residual


def test_the_form_offers_every_architecture_as_a_choice():
    schema = ModelSpec.model_json_schema()["properties"]["architecture"]
    assert schema["enum"] == list(ARCHITECTURES) and schema["default"] == "resnet18"


def test_input_sizes_follow_the_family():
    assert input_size("vit_b_16", None, automatic=32) == 224
    assert input_size("vit_b_16", 224, automatic=32) == 224
    with pytest.raises(InvalidTrainingSetupError, match="vit_b_16 .* takes 224 px images only"):
        input_size("vit_b_16", 64, automatic=32)
    assert input_size("alexnet", None, automatic=32) == 64
    with pytest.raises(InvalidTrainingSetupError, match="densenet121 .* needs at least 32 px"):
        input_size("densenet121", 16, automatic=32)
    assert input_size("resnet18", 16, automatic=224) == 16 and input_size("resnet18", None, automatic=96) == 96


def _built_on_meta(architecture: str) -> nn.Module:
    # Shapes without memory or initialisation: every family but RegNet, whose builder reads tensor values.
    with torch.device("meta"):
        return torchvision.models.get_model(architecture, weights=None)


@pytest.mark.slow
def test_every_head_path_is_the_networks_last_linear_layer():
    for architecture in ARCHITECTURES:
        if family_of(architecture).name == "RegNet" and not architecture.endswith("400mf"):
            continue  # the same builder and head as the 400mf ones; the largest would take 2.6 GB to build
        model = (
            torchvision.models.get_model(architecture)
            if architecture.startswith("regnet")
            else _built_on_meta(architecture)
        )
        linears = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
        assert linears[-1] == family_of(architecture).head, architecture
        assert isinstance(head_module(model, architecture), nn.Linear)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family", [f for f in FAMILIES if f.image_size or f.min_image_size > 16], ids=lambda family: family.name
)
def test_the_recorded_input_sizes_are_the_limits(family):
    """The fixed size runs and the next smaller one fails; the minimum runs and 8 px less fails (training mode)."""
    model = _built_on_meta(family.architectures[0]).train()
    size = family.image_size or family.min_image_size
    with torch.device("meta"):
        assert model(torch.empty(2, 3, size, size)).shape == (2, 1000)
        with pytest.raises((RuntimeError, ValueError, AssertionError)):
            model(torch.empty(2, 3, size - 8, size - 8))


def _model_directory(root, architecture: str, model: nn.Module, image_size: int) -> ModelDirectory:
    classes = ["a", "b", "c"]
    root.mkdir()
    spec = TrainedModelSpec(architecture=architecture, num_classes=len(classes), image_size=image_size)
    (root / "model_spec.json").write_text(spec.model_dump_json())
    (root / CLASSES_FILE).write_text(json.dumps(classes))
    torch.save(model.state_dict(), root / WEIGHTS_FILE)
    return ModelDirectory(root)


@pytest.mark.slow
@pytest.mark.parametrize(
    "architecture",
    ["efficientnet_v2_s", "convnext_tiny", "mobilenet_v3_large", "regnet_y_400mf", "swin_t", "vit_b_32"],
)
def test_a_new_family_builds_trains_a_step_and_exports_to_onnx(architecture, tmp_path):
    torch.manual_seed(0)
    size = input_size(architecture, None, automatic=32)
    model = build_network(ModelSpec(architecture=architecture), num_classes=3)
    head = head_module(model, architecture)
    before = head.weight.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.functional.cross_entropy(model.train()(torch.randn(2, 3, size, size)), torch.tensor([0, 2]))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(head.weight, before)

    model_dir = export_onnx(_model_directory(tmp_path / "model", architecture, model, size))
    assert check_onnx(model_dir) <= ONNX_TOLERANCE


def test_the_zoo_is_the_azure_components():
    assert DENSENETS == ("densenet121", "densenet161", "densenet169", "densenet201")
    assert set(RESNETS) >= {"resnet18", "resnet152", "resnext101_32x8d", "wide_resnet101_2"}
