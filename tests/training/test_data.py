"""The training's images: the transforms against the usual PIL pipeline, and the decode on the CPU or the device
(the decoded-image cache's budget: tests/vision/test_images.py)."""

from pathlib import Path

import torch

from tasks.contracts.transformations import ImageTransformations
from tasks.vision.payloads import PackedPayloads
from tasks.vision.transforms import eval_transform, train_transform
from tests.helpers import write_class_folders


def test_transforms_compute_what_the_usual_pil_pipeline_computes():
    """Our two-stage transforms (cacheable decode, then crop/normalise on tensors) against the torchvision
    composition everyone writes on PIL images: same random crops from the same seed, same values to the bit."""
    from PIL import Image
    from torchvision import transforms as T

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    generator = torch.Generator().manual_seed(0)
    for shape, size in (((8, 8, 3), 32), ((37, 50, 3), 64), ((200, 300, 3), 224)):
        image = Image.fromarray(torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator).numpy())
        usual_train = T.Compose(
            [
                T.Resize((size, size)),
                T.RandomCrop(size, padding=size // 8, padding_mode="edge"),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        )
        usual_eval = T.Compose([T.Resize((size, size)), T.ToTensor(), T.Normalize(mean, std)])
        torch.manual_seed(3)
        expected = [usual_train(image) for _ in range(4)]
        torch.manual_seed(3)
        ours = [train_transform(ImageTransformations(), size, mean, std)(image) for _ in range(4)]
        assert all(torch.equal(a, b) for a, b in zip(expected, ours))
        assert torch.equal(usual_eval(image), eval_transform(ImageTransformations(), size, mean, std)(image))
        # The worker normalises whole uint8 batches (on the GPU there): the same bits as image by image.
        transform = train_transform(ImageTransformations(), size, mean, std)
        torch.manual_seed(3)
        pixels = torch.stack([transform.augment(transform.decode(image)) for _ in range(4)])
        assert pixels.dtype == torch.uint8 and torch.equal(transform.normalize(pixels), torch.stack(expected))
        # Other options too: the torchvision classes on PIL images, ours on uint8 tensors, the same bits.
        options = ImageTransformations(
            resize={"size": size + 8, "keep_aspect_ratio": True},
            center_crop=True,
            random_crop={"padding": 0.25, "padding_mode": "reflect"},
            random_horizontal_flip=True,
        )
        usual_train = T.Compose(
            [
                T.Resize(size + 8),
                T.CenterCrop(size),
                T.RandomCrop(size, padding=size // 4, padding_mode="reflect"),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        )
        torch.manual_seed(3)
        expected = [usual_train(image) for _ in range(4)]
        torch.manual_seed(3)
        assert all(torch.equal(a, train_transform(options, size, mean, std)(image)) for a in expected)
        usual_eval = T.Compose([T.Resize(size + 8), T.CenterCrop(size), T.ToTensor(), T.Normalize(mean, std)])
        assert torch.equal(usual_eval(image), eval_transform(options, size, mean, std)(image))


def test_decoding_on_the_device_feeds_the_network_what_the_loader_path_does(tmp_path):
    """``decode_on="device"`` (auto's choice on CUDA from JPEGs), here on the CPU: the loaders hand over encoded JPEGs,
    the device pipeline decodes them a batch at a time; validation inputs agree with the loader path's within one grey
    level (torch's antialiased resize for PIL's) and the training batch comes in the network's shape."""
    from tasks.contracts.image_directory import ImageDirectory
    from tasks.contracts.model_directory import ModelSpec, TrainedModelSpec
    from tasks.contracts.training_config import TrainingParams
    from tasks.convert.conversion import convert_to_image_directory
    from tasks.training.data import TrainingData
    from tasks.training.distributed import DistributedEnv

    source = write_class_folders(tmp_path / "src", per_class=3, ext=".jpg")
    images = ImageDirectory(convert_to_image_directory(source, tmp_path / "images").root)
    spec = TrainedModelSpec(**ModelSpec(architecture="resnet18").model_dump(), num_classes=3, image_size=32)
    env, cpu = (
        DistributedEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, restart_count=0),
        torch.device("cpu"),
    )
    loaded = {
        where: TrainingData.load(images, images, spec, TrainingParams(batch_size=4, decode_on=where), env, cpu)
        for where in ("cpu", "device")
    }
    assert "JPEGs on cpu in batches" in loaded["device"].decoded and "loader" in loaded["cpu"].decoded
    inputs = {where: [data.val_input(batch[0]) for batch in data.val_loader] for where, data in loaded.items()}
    for on_device, by_loader in zip(inputs["device"], inputs["cpu"], strict=True):
        assert on_device.shape == by_loader.shape and on_device.dtype == torch.float32
        assert (on_device - by_loader).abs().max() <= 1.01 / 255 / min(spec.std)
    payloads, _ = next(iter(loaded["device"].train_loader.loader))  # what the loader processes hand over
    assert isinstance(payloads, PackedPayloads) and all(p.dim() == 1 for p in payloads.unpack()), "encoded JPEGs"
    decoded, labels = next(iter(loaded["device"].train_loader))  # decoded ahead, in a thread
    assert decoded.dtype == torch.uint8 and loaded["device"].train_input(decoded).shape == (len(labels), 3, 32, 32)


def test_auto_decodes_on_the_device_when_training_on_cuda_from_jpegs():
    from tasks.contracts.training_config import TrainingParams
    from tasks.training.data import where_to_decode

    jpegs = [(Path(f"c/{i}.JPG" if i % 3 else f"c/{i}.jpeg"), 0) for i in range(1000)]
    pngs = [(Path(f"c/{i}.png"), 0) for i in range(600)]
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    auto = TrainingParams()
    assert auto.decode_on == "auto"
    assert where_to_decode(auto, jpegs, cuda) == "device"
    assert (
        where_to_decode(auto, jpegs + pngs, cuda) == "device" and where_to_decode(auto, pngs + jpegs, cuda) == "device"
    )
    assert where_to_decode(auto, pngs, cuda) == "cpu", "other formats keep the loader's decoded-image cache"
    assert where_to_decode(auto, jpegs[:600] + pngs + pngs, cuda) == "cpu"
    assert where_to_decode(auto, jpegs, cpu) == "cpu" and where_to_decode(auto, [], cuda) == "cpu"
    for chosen in ("cpu", "device"):
        assert where_to_decode(TrainingParams(decode_on=chosen), pngs, cpu) == chosen
