"""Model zoo and loading pretrained weights from a file (where the file comes from: tests/vision/test_weights.py)."""

import re

import pytest
import torch
import torchvision

from tasks.contracts.model_directory import ModelSpec
from tasks.vision.networks import backbone_modules, build_network, split_head_and_backbone


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["resnet18", "densenet121", "resnext50_32x4d", "wide_resnet50_2"])
def test_heads_match_the_number_of_classes(architecture):
    model = build_network(ModelSpec(architecture=architecture), num_classes=7)
    logits = model.eval()(torch.zeros(2, 3, 32, 32))
    assert logits.shape == (2, 7)


def test_family_options_reach_the_model():
    densenet = build_network(ModelSpec(architecture="densenet121", memory_efficient=True), 3)
    assert all(
        layer.memory_efficient
        for name, layer in densenet.features.named_modules()
        if "denselayer" in name and name.count(".") == 1
    )
    resnet = build_network(ModelSpec(architecture="resnet18", zero_init_residual=True), 3)
    assert torch.count_nonzero(resnet.layer1[0].bn2.weight) == 0


def test_pretrained_weights_from_a_local_file_then_a_new_head(tmp_path):
    torch.manual_seed(3)
    imagenet = torchvision.models.resnet18()
    weights = tmp_path / "resnet18-imagenet.pth"
    torch.save(imagenet.state_dict(), weights)
    model = build_network(ModelSpec(pretrained=True), num_classes=4, weights_file=weights)
    assert torch.equal(model.conv1.weight, imagenet.conv1.weight)
    assert model.fc.out_features == 4


@pytest.mark.slow
def test_pretrained_densenet_in_torchvisions_old_key_format(tmp_path):
    imagenet = torchvision.models.densenet121()
    # The published file spells "norm1" as "norm.1" and predates BatchNorm's num_batches_tracked.
    old_keys = {
        re.sub(r"(denselayer\d+\.(?:norm|relu|conv))([12])\.", r"\1.\2.", k): v
        for k, v in imagenet.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    assert any(".norm.1." in key for key in old_keys)
    torch.save(old_keys, tmp_path / "densenet121.pth")
    model = build_network(
        ModelSpec(architecture="densenet121"), num_classes=3, weights_file=tmp_path / "densenet121.pth"
    )
    assert torch.equal(model.features.conv0.weight, imagenet.features.conv0.weight)
    assert model.classifier.out_features == 3


def test_head_and_backbone_split_every_parameter_once():
    model = build_network(ModelSpec(architecture="mobilenet_v3_small"), num_classes=3)
    head, backbone = split_head_and_backbone(model, "mobilenet_v3_small")
    assert [p.shape for p in head] == [(3, 1024), (3,)]
    assert {id(p) for p in head} | {id(p) for p in backbone} == {id(p) for p in model.parameters()}
    assert len(head) + len(backbone) == len(list(model.parameters()))
    frozen = backbone_modules(model, "mobilenet_v3_small")
    assert model.classifier[2] in frozen and model.features in frozen  # the Dropout before the head, the body
    assert model.classifier not in frozen and model.classifier[3] not in frozen and model not in frozen
