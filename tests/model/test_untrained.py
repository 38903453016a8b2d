"""The untrained model directory the model stage writes (where its weights come from: tests/vision/test_weights.py)."""

import pytest
import torch
import torchvision

from tasks.contracts.model_directory import ModelSpec
from tasks.errors import InvalidModelDirectoryError
from tasks.model.untrained import with_pretrained_default, write_untrained_model_directory


def test_pretrained_by_default_for_own_images_not_for_the_bundled_digits():
    assert with_pretrained_default(ModelSpec(), own_data=True).pretrained is True
    assert with_pretrained_default(ModelSpec(), own_data=False).pretrained is False
    assert with_pretrained_default(ModelSpec(weights_path="w.pth"), own_data=False).pretrained is True
    assert with_pretrained_default(ModelSpec(pretrained=False), own_data=True).pretrained is False


@pytest.mark.slow
def test_weights_of_another_architecture_are_refused_before_training(tmp_path):
    weights = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    with pytest.raises(InvalidModelDirectoryError, match="do not fit resnet34"):
        write_untrained_model_directory(
            tmp_path / "model", ModelSpec(architecture="resnet34", pretrained=True, weights_path=str(weights))
        )
    weights.write_bytes(b"not a state dict")
    with pytest.raises(InvalidModelDirectoryError, match="not a readable PyTorch state dict"):
        write_untrained_model_directory(tmp_path / "model", ModelSpec(pretrained=True, weights_path=str(weights)))
