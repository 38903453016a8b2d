"""Accelerator figures: ResNet-50 training images/s from an ImageDirectory of JPEGs through the real torchrun
worker (bf16 autocast + channels_last on CUDA), with the images decoded by the loader's CPU processes and by the
device (``decode_on``), side by side in one run; beside them the two ceilings: the data loading alone (each way)
and the device alone (training steps on one batch in device memory: eager, a larger batch, the default optimiser
instead of the fused one, and with ``--compile`` torch.compile). Training's share of the device ceiling is the
utilisation figure: nvidia-smi read 0% on the H100 guest this was first measured on, even under load.

    python -m bench.gpu                         # on a CUDA host: ResNet-50 @224, batch 256, 4,096 JPEGs
    python -m bench.gpu --images 256            # a smaller run
    python -m bench.gpu --compile               # also the device ceiling under torch.compile (a minute or two)

Without CUDA it runs the same paths on the CPU with a small model (ResNet-18 @64) and few images, so the
script stays tested; the accelerator figure is then reported as pending. Works with a preinstalled torch
(2.11 / torchvision 0.26 on the GPU hosts) and no package index: `PYTHONPATH=. python -m bench.gpu`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

from bench.harness import Figure, table
from tasks import convert_to_image_directory
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import IMAGENET_MEAN, IMAGENET_STD, ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.model import write_untrained_model_directory
from tasks.torchrun_launcher import launch_training
from tasks.training.loop import autocast, make_optimizer
from tasks.transformations import ImageTransformations
from tasks.vision.device_pipeline import DevicePipeline
from tasks.vision.images import ImageFiles
from tasks.vision.networks import build_network, memory_format
from tasks.vision.payloads import EncodedImageFiles, collate_payloads
from tasks.vision.transforms import train_transform

H100_GOAL = 3200.0  # the team goal for one H100 (the seed table's 16 x V100 figure)


def write_jpegs(root: Path, count: int, side: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = rng.integers(0, 255, (side // 8, side // 8, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).resize((side, side), Image.Resampling.BILINEAR)
        folder = root / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{i:06d}.jpg", quality=90)


def loader_ceiling(image_dir: Path, size: int, batch: int, workers: int, decode_on: str, seconds: float = 20) -> float:
    """Images/s the data loading alone delivers as the worker uses it: with ``decode_on="cpu"`` the DataLoader's
    processes decode, resize and crop (uint8 batches, normalised on the GPU later: not counted); with "device" they
    read files and the device decodes, resizes, crops and normalises each batch (counted, synchronised)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = train_transform(ImageTransformations(), size, IMAGENET_MEAN, IMAGENET_STD)
    samples = ImageDirectory(image_dir).samples()
    options = {"batch_size": batch, "shuffle": True, "num_workers": workers, "persistent_workers": workers > 0}
    if decode_on == "device":
        pipeline = DevicePipeline(transform, ImageTransformations(), size, device)
        dataset = EncodedImageFiles(samples, transform)
        loader = DataLoader(dataset, collate_fn=collate_payloads, pin_memory=device.type == "cuda", **options)

        def ready(batch) -> int:
            images = pipeline(batch[0])
            if device.type == "cuda":
                torch.cuda.synchronize()
            return images.size(0)
    else:
        loader = DataLoader(ImageFiles(samples, transform, normalized=False), **options)

        def ready(batch) -> int:
            return batch[0].size(0)

    seen, start, warm = 0, None, False
    while start is None or time.perf_counter() - start < seconds:
        for batch in loader:
            if not warm:  # the first batch pays for starting the workers (and nvJPEG's handles)
                ready(batch)
                warm, start = True, time.perf_counter()
                continue
            seen += ready(batch)
            if time.perf_counter() - start >= seconds:
                break
    return seen / (time.perf_counter() - start)


def device_ceiling(
    architecture: str,
    size: int,
    batch: int,
    classes: int = 10,
    steps: int = 40,
    compile: bool = False,
    fused: bool = True,
) -> tuple[float, float]:
    """(images/s, seconds of the warm-up steps) of the worker's training step on one batch already on the device
    (its model, fused SGD unless ``fused`` is False, bf16 autocast and channels_last): the most training can get
    from the device alone, with no loading at all. ``compile``: the model through torch.compile first (the warm-up
    seconds then include compiling)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    params = TrainingParams(batch_size=batch, image_size=size)
    model = build_network(ModelSpec(architecture=architecture), classes).to(device, memory_format=memory_format(device))
    if fused:
        optimizer = make_optimizer(model, 0.1, params)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
    forward = torch.compile(model) if compile else model
    criterion = torch.nn.CrossEntropyLoss()
    images = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=memory_format(device))
    labels = torch.randint(0, classes, (batch,), device=device)

    def step() -> None:
        with autocast(device, params):
            loss = criterion(forward(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    started = time.perf_counter()
    for _ in range(5):  # cuDNN's algorithm search, the allocator's first blocks, compiling
        step()
    synchronize()
    warm_up = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return steps * batch / (time.perf_counter() - started), warm_up


def train_through_the_worker(
    image_dir: Path, scratch: Path, architecture: str, size: int, batch: int, workers: int, decode_on: str
) -> tuple[float, str]:
    """(images/s of the later epochs' median, the rank's plan line) of a real torchrun launch, 3 epochs."""
    spec = write_untrained_model_directory(scratch / f"spec-{decode_on}", ModelSpec(architecture=architecture))
    params = TrainingParams(
        epochs=3,
        batch_size=batch,
        image_size=size,
        data_workers=workers,
        learning_rate=0.01,  # 0.1 without warmup diverged once on these noise images; the rate does not change speed
        print_frequency=10**6,
        decode_on=decode_on,
    )
    output = scratch / f"model-{decode_on}"
    model_dir = launch_training(
        TrainingFolders(image_dir, image_dir, spec, output), params, log=lambda level, line: None
    )
    rates = [epoch.train_images_per_s for epoch in model_dir.metrics().epochs[1:]]
    plan = next(
        (line for line in (output / "logs" / "driver_log_0.txt").read_text().splitlines() if "images decoded" in line),
        "",
    )
    return statistics.median(rates), plan.split("images decoded ")[-1].split(";")[0]


def measured(what: str, images_per_s: float) -> float:
    """Each figure printed as it comes: a run cut short still shows what it measured."""
    print(f"{what}: {images_per_s:.1f} images/s", flush=True)
    return images_per_s


def figures(images: int | None = None, ceiling_seconds: float | None = None, compile: bool = False) -> list[Figure]:
    cuda = torch.cuda.is_available()
    architecture, size, batch = ("resnet50", 224, 256) if cuda else ("resnet18", 64, 32)
    images = images or (4096 if cuda else 192)
    workers = max(0, min(12, (os.cpu_count() or 1) - 2))
    seconds = ceiling_seconds or (10 if cuda else 5)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        scratch = Path(scratch)
        write_jpegs(scratch / "jpegs", images, side=size + size // 7)
        image_dir = convert_to_image_directory(scratch / "jpegs", scratch / "images").root
        ceilings, trained = {}, {}
        for where in ("device", "cpu"):
            ceiling = loader_ceiling(image_dir, size, batch, workers, where, seconds)
            ceilings[where] = measured(f"data-loading ceiling, decoded on {where}", ceiling)
        for where in ("device", "cpu"):
            trained[where] = train_through_the_worker(image_dir, scratch, architecture, size, batch, workers, where)
            measured(f"training, decoded on {where}", trained[where][0])
    steps = 40 if cuda else 3
    eager = measured("device ceiling", device_ceiling(architecture, size, batch, steps=steps)[0])
    unfused = measured(
        "device ceiling, default SGD", device_ceiling(architecture, size, batch, steps=steps, fused=False)[0]
    )
    doubled = measured(
        f"device ceiling, batch {2 * batch}", device_ceiling(architecture, size, 2 * batch, steps=max(1, steps // 2))[0]
    )

    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({os.cpu_count()} cores), GPU figure pending"
    setting = f"{architecture} @{size}px, batch {batch}, {images} JPEGs {size + size // 7} px, {workers} loader workers, {device}"
    default = "device" if cuda else "cpu"  # decode_on="auto": the device when training on CUDA from JPEGs
    training = trained[default][0]
    result = [
        Figure(
            f"training {architecture} (bf16 + channels_last on CUDA)",
            training,
            None,
            "images/s",
            ">= 3,200 images/s on one H100" if cuda else "pending: no GPU",
            H100_GOAL if cuda else None,
            notes=f"{setting}; median of epochs 2-3; decoded {trained[default][1]} (the default, decode_on=auto)",
        ),
        Figure(
            "training: decoded on the device vs by the loader's processes (decode_on)",
            trained["device"][0],
            trained["cpu"][0],
            "images/s",
            "faster, to be the default on CUDA",
            1.0,
            notes=f"the same run's two launches; the device side decoded {trained['device'][1]}",
        ),
        Figure(
            "data-loading ceiling: decoded on the device vs by the loader's processes",
            ceilings["device"],
            ceilings["cpu"],
            "images/s",
            "above training",
            notes=f"{setting}; device side: file bytes from the loader, then decode, resize, crop, normalise on it",
        ),
        Figure(
            "device ceiling (training steps on one batch in device memory)",
            eager,
            None,
            "images/s",
            ">= 80% of it reached by training",
            notes=f"{setting}; training reached {training / eager:.0%} of it",
        ),
        Figure("device ceiling: fused SGD vs the default (foreach)", eager, unfused, "images/s", "kept if faster"),
        Figure(
            f"device ceiling: batch {2 * batch} vs {batch} (images/s)", doubled, eager, "images/s", "kept if faster"
        ),
    ]
    if compile:
        compiled, compiling = device_ceiling(architecture, size, batch, steps=steps, compile=True)
        result.append(
            Figure(
                "device ceiling: torch.compile vs eager",
                compiled,
                eager,
                "images/s",
                "kept if faster",
                notes=f"compiling and warm-up took {compiling:.0f} s",
            )
        )
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="also the device ceiling under torch.compile")
    args = parser.parse_args()
    print(table(figures(args.images, compile=args.compile)))
