"""On a CUDA host: the pipeline end to end on the GPU (bf16 autocast, channels_last, cuDNN), ResNet-50 at 224 px
from JPEGs decoded on the GPU, training through torch.compile, the device pipeline against the same code on the
CPU (phone photos turned upright on both), GPU scoring against the CPU's ONNX export, and a clear error for more
processes than GPUs.

Skipped elsewhere with the reason shown in pytest's summary (CI has no GPU). On a GPU host:

    PYTHONPATH=. python -m pytest -m gpu tests/test_gpu.py
    bash bench/on_gpu.sh smoke      # these tests and the device pipeline's, with the wheels the host lacks
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flows.pipeline import train_pipeline
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory, ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.errors import InvalidTrainingSetupError, PipelineInputError
from tasks.evaluation.score import score_images
from tasks.launch.torchrun_launcher import launch_training
from tasks.registry import read_registration
from tests.helpers import write_phone_photos

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU host"),
]


def rank_log(model_dir: str | Path, rank: int = 0) -> str:
    return (Path(model_dir) / "logs" / f"driver_log_{rank}.txt").read_text()


def test_digits_pipeline_trains_scores_and_registers_on_the_gpu(prefect_server, digits_subset, tmp_path):
    train, val = digits_subset
    result = train_pipeline(
        train_data=str(train),
        validation_data=str(val),
        model=ModelSpec(architecture="resnet18", pretrained=False),
        training=TrainingParams(epochs=4, learning_rate=0.004),
        registry=str(tmp_path / "registry"),
        work_dir=str(tmp_path / "runs"),
        export_onnx=True,
    )

    model_dir = ModelDirectory(result.location)
    assert "on cuda:0 (single process, bf16 autocast, channels_last)" in rank_log(Path(result.run_dir) / "model")
    assert result.version == 1 and "model.onnx" in read_registration(tmp_path / "registry", result.model_name, 1).files
    assert result.evaluation.images == 100 and result.evaluation.accuracy >= 0.7
    # The GPU's scores (TF32 convolutions) agree with the ONNX export run on the CPU.
    images = ImageDirectory(Path(result.run_dir) / "data" / "validation")
    on_gpu = score_images(model_dir, images)
    on_cpu = score_images(model_dir, images, runtime="onnx")
    columns = [c for c in on_gpu.columns if c.startswith("Scored Probabilities_")]
    worst = np.abs(on_gpu[columns].to_numpy() - on_cpu[columns].to_numpy()).max()
    print(f"GPU torch vs CPU onnxruntime: max abs probability difference {worst:.2e}")
    assert worst < 1e-2 and (on_gpu["Scored Labels"] == on_cpu["Scored Labels"]).mean() >= 0.99
    # bf16 autocast, on request: the same labels but for a near tie or two.
    in_bf16 = score_images(model_dir, images, precision="bf16")
    worst = np.abs(in_bf16[columns].to_numpy() - on_gpu[columns].to_numpy()).max()
    print(f"GPU bf16 vs fp32: max abs probability difference {worst:.2e}")
    assert (in_bf16["Scored Labels"] == on_gpu["Scored Labels"]).mean() >= 0.98


def write_jpegs(root, count: int, classes: int, side: int = 256):
    """Noisy JPEGs with a colour cast per class: the path at full size (ResNet-50 from scratch on a hundred
    images learns little in two epochs, so accuracy is not asserted)."""
    rng = np.random.default_rng(count)
    for i in range(count):
        label = i % classes
        pixels = rng.integers(0, 64, (side, side, 3), dtype=np.uint8)
        pixels[..., label % 3] += 160
        (root / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / f"c{label}" / f"{i:04d}.jpg", quality=90)
    return root


def test_resnet50_at_224_from_jpegs_on_the_gpu(prefect_server, tmp_path):
    train = write_jpegs(tmp_path / "train", 96, classes=3)
    val = write_jpegs(tmp_path / "val", 30, classes=3)
    result = train_pipeline(
        train_data=str(train),
        validation_data=str(val),
        model=ModelSpec(architecture="resnet50", pretrained=False),
        training=TrainingParams(epochs=2, batch_size=32, image_size=224, learning_rate=0.01, decode_on="device"),
        registry=str(tmp_path / "registry"),
        work_dir=str(tmp_path / "runs"),
        export_onnx=True,
    )

    model_dir = ModelDirectory(result.location)
    assert model_dir.spec.architecture == "resnet50" and model_dir.spec.image_size == 224
    log = rank_log(Path(result.run_dir) / "model")
    assert "on cuda:0 (single process, bf16 autocast, channels_last)" in log
    assert "images decoded JPEGs on cuda:0 in batches" in log
    assert result.version == 1 and result.evaluation.images == 30
    assert "model.onnx" in read_registration(tmp_path / "registry", result.model_name, 1).files


def test_more_processes_than_gpus_is_an_input_error(colour_image_dirs, resnet_spec, tmp_path):
    train, val = colour_image_dirs
    params = TrainingParams(epochs=1, processes_per_node=torch.cuda.device_count() + 1, device="cuda")
    with pytest.raises(InvalidTrainingSetupError) as error:
        launch_training(
            TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
        )
    assert isinstance(error.value, PipelineInputError), "not retried"
    assert f"this host has {torch.cuda.device_count()} CUDA device(s)" in str(error.value)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs (one rank per GPU)")
def test_two_gpus_train_with_nccl(colour_image_dirs, resnet_spec, tmp_path):
    train, val = colour_image_dirs
    params = TrainingParams(epochs=1, processes_per_node=2)
    model_dir = launch_training(
        TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
    )
    assert "rank 0/2 on cuda:0 (nccl, bf16 autocast, channels_last)" in rank_log(model_dir.root)


def test_the_device_pipeline_on_the_gpu_computes_what_it_does_on_the_cpu(tmp_path):
    """nvJPEG against libjpeg-turbo, then the same tensor code on both devices. The two decoders may differ (the JPEG
    standard leaves the inverse DCT's rounding and chroma upsampling open): for every image they agree more closely
    than either agrees with the picture before it was compressed. The random crops and flips are the same to the
    bit; a PNG takes the CPU's PIL path on both."""
    from tasks.contracts.transformations import ImageTransformations
    from tasks.vision.device_pipeline import DevicePipeline
    from tasks.vision.payloads import EncodedImageFiles, collate_payloads
    from tasks.vision.transforms import train_transform

    rng = np.random.default_rng(0)
    paths, originals = [], []
    for i, (width, height, mode, suffix) in enumerate(
        [(320, 240, "RGB", ".jpg")] * 3
        + [(500, 375, "RGB", ".jpg"), (256, 256, "L", ".jpg"), (300, 200, "CMYK", ".jpg"), (64, 64, "RGB", ".png")]
    ):
        small = rng.integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
        image = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC).convert(mode)
        paths.append(tmp_path / f"{i}{suffix}")
        image.save(paths[-1], **({"quality": 92} if suffix == ".jpg" else {}))
        originals.append(image.convert("RGB"))
    options = ImageTransformations(random_horizontal_flip=True)
    transform = train_transform(options, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    dataset = EncodedImageFiles([(path, 0) for path in paths], transform)
    payloads, _ = collate_payloads([dataset[i] for i in range(len(dataset))])
    gpu = DevicePipeline(transform, options, 224, torch.device("cuda"))
    cpu = DevicePipeline(transform, options, 224, torch.device("cpu"))

    on_gpu, on_cpu = gpu.decode(payloads), cpu.decode(payloads)
    assert on_gpu.is_cuda and on_gpu.shape == on_cpu.shape == (7, 3, 224, 224)
    decoders_apart = (on_gpu.cpu().int() - on_cpu.int()).abs().float().mean(dim=(1, 2, 3))
    before_compression = torch.stack([transform.decode(original) for original in originals])
    compression_error = (on_cpu.int() - before_compression.int()).abs().float().mean(dim=(1, 2, 3))
    print(
        "grey levels apart per image, nvJPEG + CUDA resize vs libjpeg-turbo + CPU resize: "
        f"{[round(x, 3) for x in decoders_apart.tolist()]}; the JPEG's own error: "
        f"{[round(x, 3) for x in compression_error.tolist()]}"
    )
    assert all(decoders_apart[:6] < compression_error[:6])
    assert torch.equal(on_gpu[6].cpu(), on_cpu[6])  # the PNG: PIL on both
    torch.manual_seed(5)
    augmented_on_gpu = gpu.augment(on_cpu.cuda())
    torch.manual_seed(5)
    augmented_on_cpu = cpu.augment(on_cpu)
    assert torch.equal(augmented_on_gpu.cpu(), augmented_on_cpu)
    # CUDA divides by a scalar as a multiplication by its reciprocal: the last bit may differ.
    normalised_on_gpu = gpu.transform.normalize(augmented_on_gpu).cpu()
    assert torch.allclose(normalised_on_gpu, cpu.transform.normalize(augmented_on_cpu), rtol=0, atol=1e-5)
    normalised = gpu(payloads)
    assert normalised.is_cuda and normalised.dtype == torch.float32 and normalised.shape == (7, 3, 224, 224)


def test_training_through_torch_compile_on_the_gpu(colour_image_dirs, resnet_spec, tmp_path):
    train, val = colour_image_dirs
    params = TrainingParams(epochs=2, batch_size=8, compile="on", learning_rate=0.01)
    model_dir = launch_training(
        TrainingFolders(train, val, resnet_spec, tmp_path / "model"), params, log=lambda level, line: None
    )
    assert "torch.compile: the network compiles at the first full batch" in rank_log(model_dir.root)
    epochs = model_dir.metrics().epochs
    assert len(epochs) == 2 and all(np.isfinite(epoch.train_loss) for epoch in epochs)
    print(f"compiled training: epoch 1 {epochs[0].seconds:.1f} s (compiling), epoch 2 {epochs[1].seconds:.2f} s")


def test_phone_photos_are_upright_on_the_gpu_as_on_the_cpu(tmp_path):
    """nvJPEG ignores the EXIF orientation tag (torchvision's apply_exif_orientation is for its CPU decoder): the
    device pipeline turns each photo itself, and so reaches the pixels the loader's PIL path gives."""
    from tasks.contracts.transformations import ImageTransformations
    from tasks.vision.device_pipeline import DevicePipeline
    from tasks.vision.images import ImageFiles
    from tasks.vision.payloads import EncodedImageFiles, collate_payloads
    from tasks.vision.transforms import eval_transform

    photos = write_phone_photos(tmp_path, width=320, height=240)
    options = ImageTransformations()
    transform = eval_transform(options, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    samples = [(path, 0) for path in photos]
    dataset = EncodedImageFiles(samples, transform)
    payloads, _ = collate_payloads([dataset[i] for i in range(len(dataset))])
    on_gpu = DevicePipeline(transform, options, 224, torch.device("cuda")).decode(payloads).cpu()
    loader = ImageFiles(samples, transform, normalized=False)
    by_pil = torch.stack([loader[i][0] for i in range(len(loader))])
    as_stored = by_pil[0]  # orientation 1: as stored and as displayed
    apart = (on_gpu.int() - by_pil.int()).abs().float().mean(dim=(1, 2, 3))
    wrong_way = (as_stored.int() - by_pil.int()).abs().float().mean(dim=(1, 2, 3))
    print(f"GPU vs PIL upright, grey levels per orientation 1-8: {[round(x, 2) for x in apart.tolist()]}")
    assert apart.max() < 3 and wrong_way[1:].min() > 10


def test_the_endpoint_s_model_decodes_jpegs_on_the_gpu_and_answers_as_on_the_cpu(tmp_path):
    """tasks/serving on CUDA: a JPEG's bytes go to the device with their batch (nvJPEG, turned upright there), a PNG
    is decoded by PIL; the probabilities are the CPU's within what nvJPEG's decode differs by."""
    from bench.score import random_model_directory
    from tasks.serving.model import Identity, ServedModel

    model_dir = random_model_directory(tmp_path / "model", "resnet18", [f"c{i}" for i in range(10)], 224)
    photos = write_phone_photos(tmp_path / "photos", width=320, height=240)
    Image.open(photos[5]).save(tmp_path / "photo.png")
    files = [path.read_bytes() for path in [*photos, tmp_path / "photo.png"]]
    identity = Identity("m", 1, None, "", "torch", str(tmp_path))
    on_gpu = ServedModel(model_dir, identity, device="cuda", max_pixels=10**8)
    on_cpu = ServedModel(model_dir, identity, device="cpu", max_pixels=10**8)
    decoded = [on_gpu.decode(data, f"image {i}") for i, data in enumerate(files)]
    assert [payload.dim() for payload in decoded] == [1] * len(photos) + [3]  # JPEG bytes, a decoded PNG
    on_gpu.warm([1, len(files)])
    gpu = on_gpu.forward(decoded)
    cpu = on_cpu.forward([on_cpu.decode(data, f"image {i}") for i, data in enumerate(files)])
    print(f"served on the GPU vs the CPU, largest probability gap: {np.abs(gpu - cpu).max():.2e}")
    assert gpu.shape == cpu.shape == (len(files), 10) and np.abs(gpu - cpu).max() < 0.02
