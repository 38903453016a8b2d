"""Image transformations: the typed options, the pipelines built from them, which of them inference applies."""

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from tasks.contracts.model_directory import ModelDirectory, ModelSpec
from tasks.contracts.transformations import DETERMINISTIC, RANDOM, ImageTransformations
from tasks.errors import InvalidTransformationsError
from tasks.vision.transforms import EdgePaddedRandomCrop, eval_transform, train_transform
from tests.contracts.transformation_options import EVERY_OPTION

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def photo(width: int = 27, height: int = 19, seed: int = 0) -> Image.Image:
    pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return Image.fromarray(pixels.numpy())


def draws(transform, image, seed: int, count: int = 3) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [transform(image) for _ in range(count)]


@pytest.mark.parametrize("size", [32, 64])
def test_the_default_is_the_pipeline_training_always_had(size):
    """Resize to size x size, random crop with 1/8 edge padding, normalise: torchvision's v2 classes, to the bit."""
    reference = v2.Compose(
        [
            v2.Resize((size, size)),
            v2.PILToTensor(),
            v2.RandomCrop(size, padding=size // 8, padding_mode="edge"),
            v2.Lambda(lambda pixels: pixels.float() / 255),  # as ToTensor (ToDtype multiplies by 1 / 255)
            v2.Normalize(MEAN, STD),
        ]
    )
    reference_eval = v2.Compose([step for step in reference.transforms if not isinstance(step, v2.RandomCrop)])
    ours = train_transform(ImageTransformations(), size, MEAN, STD)
    image = photo()
    for seed in range(4):
        assert all(torch.equal(a, b) for a, b in zip(draws(reference, image, seed), draws(ours, image, seed)))
    assert torch.equal(eval_transform(ImageTransformations(), size, MEAN, STD)(image), reference_eval(image))


@pytest.mark.parametrize(("side", "size", "padding"), [(32, 32, 4), (40, 32, 3), (30, 32, 1), (9, 8, 0), (96, 96, 12)])
def test_edge_padded_crop_draws_like_torchvision(side, size, padding):
    pixels = torch.randint(0, 256, (3, side, side), dtype=torch.uint8, generator=torch.Generator().manual_seed(side))
    ours, theirs = EdgePaddedRandomCrop(size, padding), v2.RandomCrop(size, padding, padding_mode="edge")
    for seed in range(3):
        torch.manual_seed(seed)
        expected, next_draw = [theirs(pixels) for _ in range(3)], torch.randint(0, 10**9, ())
        torch.manual_seed(seed)
        assert all(torch.equal(ours(pixels), a) for a in expected)
        assert torch.randint(0, 10**9, ()) == next_draw  # as many draws as torchvision: the next option sees the same


def test_training_applies_every_option_and_inference_only_the_deterministic_ones():
    train = train_transform(EVERY_OPTION, 16, MEAN, STD)
    inference = eval_transform(EVERY_OPTION, 16, MEAN, STD)
    deterministic = ["resize", "center_crop", "pad", "rgb_to_grayscale", "pil_to_tensor"]
    assert [getattr(step, "func", step).__name__ for step in train.decode.steps] == deterministic
    assert [getattr(step, "func", step).__name__ for step in inference.decode.steps] == deterministic
    assert [type(step).__name__ for step in train.augment.steps] == [
        "RandomResizedCrop",
        "EdgePaddedRandomCrop",
        "RandomHorizontalFlip",
        "RandomVerticalFlip",
        "RandomRotation",
        "RandomAffine",
        "RandomPerspective",
        "ColorJitter",
        "RandomGrayscale",
        "RandomErasing",
    ]
    image = photo()
    first, second = draws(inference, image, 0, 1) + draws(inference, image, 1, 1)
    assert torch.equal(first, second) and first.shape == (3, 20, 20)  # 18 px crop, 1 px padding
    assert not all(torch.equal(a, b) for a, b in zip(draws(train, image, 0), draws(train, image, 1)))
    deterministic_only = EVERY_OPTION.model_dump(include=set(DETERMINISTIC)) | dict.fromkeys(RANDOM)
    assert EVERY_OPTION.for_inference() == ImageTransformations(**deterministic_only)
    assert ImageTransformations().for_inference().random_options() == []


@pytest.mark.parametrize("option", RANDOM + ("center_crop", "grayscale"))
def test_each_option_builds_and_runs(option):
    transformations = ImageTransformations(**{option: True})
    transform = train_transform(transformations, 16, MEAN, STD)
    pixels = transform.decode(photo(23, 14))
    assert pixels.dtype == torch.uint8 and pixels.shape == (3, transform.size, transform.size) == (3, 16, 16)
    torch.manual_seed(0)
    out = transform.augment(pixels)
    side = transformations.training_side(16)
    assert out.dtype == torch.uint8 and out.shape == (3, side, side)
    assert transform.normalize(out).dtype == torch.float32


def test_sizes_left_empty_follow_the_training_size():
    transformations = ImageTransformations(
        resize={"size": 40, "keep_aspect_ratio": True}, center_crop=True, random_resized_crop={"size": 24}
    )
    assert transformations.decoded_side(32) == 32 and transformations.training_side(32) == 32
    transform = train_transform(transformations, 32, MEAN, STD)
    torch.manual_seed(0)
    assert transform(photo(50, 40)).shape == (3, 32, 32)  # the default random crop takes 32 px of the 24 + 2 x 4
    assert eval_transform(transformations, 32, MEAN, STD)(photo(50, 40)).shape == (3, 32, 32)


def test_random_erasing_fills_with_the_mean_by_default():
    transformations = ImageTransformations(random_crop=None, random_erasing={"p": 1.0, "scale": (0.2, 0.3)})
    transform = train_transform(transformations, 16, MEAN, STD)
    torch.manual_seed(0)
    erased = transform.augment(transform.decode(Image.new("RGB", (16, 16), (255, 255, 255))))
    mean_pixels = erased.flatten(1).T.tolist().count([124, 116, 104])
    assert 0.2 * 256 * 0.8 <= mean_pixels <= 0.3 * 256 * 1.2
    assert transform.normalize(torch.tensor([124, 116, 104], dtype=torch.uint8).view(3, 1, 1)).abs().max() < 0.01


def test_a_crop_larger_than_the_padded_image_is_refused_at_the_training_size():
    transformations = ImageTransformations(random_crop={"size": 48, "padding": 0.125})
    with pytest.raises(InvalidTransformationsError, match="random_crop of 48 px cannot fit the 32 px image padded"):
        train_transform(transformations, 32, MEAN, STD)
    assert eval_transform(transformations, 32, MEAN, STD).size == 32


@pytest.mark.integration
def test_a_model_trained_with_transformations_scores_and_exports_with_their_deterministic_part(
    tmp_path, colour_image_dirs
):
    """Through the real worker (torchrun, 1 process, 1 epoch): the spec carries the transformations to the model
    directory; scoring and ONNX take the 20 px inputs (16 px crop + 2 px padding), not image_size x image_size."""
    from tasks.contracts.image_directory import ImageDirectory
    from tasks.evaluation.onnx_export import check_onnx, export_onnx
    from tasks.evaluation.score import score_images
    from tasks.model.untrained import write_untrained_model_directory
    from tests.helpers import run_worker

    transformations = ImageTransformations(
        resize={"size": 20, "keep_aspect_ratio": True},
        center_crop=True,
        pad={"padding": 2},
        random_horizontal_flip=True,
        random_rotation=True,
        random_erasing=True,
    )
    spec = write_untrained_model_directory(tmp_path / "spec", ModelSpec(transformations=transformations))
    train, val = colour_image_dirs
    output = tmp_path / "model"
    result = run_worker(
        *("--train", str(train), "--validation", str(val), "--model-spec", str(spec), "--output", str(output)),
        *("--epochs", "1", "--batch-size", "4", "--image-size", "16"),
        processes=1,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    model_dir = ModelDirectory(output)
    assert model_dir.spec.transformations == transformations and model_dir.spec.image_size == 16
    export_onnx(model_dir)
    assert check_onnx(model_dir, ImageDirectory(val)) < 1e-4
    by_torch = score_images(model_dir, ImageDirectory(val))
    by_onnx = score_images(model_dir, ImageDirectory(val), runtime="onnx")
    assert list(by_torch["Scored Labels"]) == list(by_onnx["Scored Labels"])
