"""Accelerator figures: ResNet-50 training images/s from an ImageDirectory of JPEGs through the real torchrun
worker (bf16 autocast + channels_last on CUDA, JPEGs decoded on the device), eager and with ``compile="on"``
(torch.compile, its compiling counted in epoch 1), and, with ``--baseline DIR``, the same launch of another copy of
the code (the commit before a change) side by side in one run; beside them the device ceiling (training steps on
one batch in device memory, eager and compiled) and a profile of ten training steps in the middle of an epoch
(the torch profiler: the device's busy share, its kernel time by kind, the host's waits). Training's share of the
device ceiling is the utilisation figure: nvidia-smi read 0% on the H100 guest this was first measured on.

    python -m bench.gpu                              # on a CUDA host: ResNet-50 @224, batch 256, 4,096 JPEGs
    python -m bench.gpu --baseline .baseline         # also the worker of the copy in .baseline (git archive)
    python -m bench.gpu --images 256 --no-compile    # a smaller run, eager only
    python -m bench.gpu --loading                    # also the data-loading ceilings (decoded on device / CPU)

Without CUDA it runs the same paths on the CPU with a small model (ResNet-18 @64) and few images, so the
script stays tested; the accelerator figure is then reported as pending. Works with a preinstalled torch
(2.11 / torchvision 0.26 on the GPU hosts) and no package index: `PYTHONPATH=. python -m bench.gpu`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch
from torch.utils.data import DataLoader

from bench.gpu_inputs import bench_images, setting
from bench.gpu_inputs import write_jpegs as write_jpegs  # bench.device_stages and bench.score take it from here
from bench.harness import Figure, table
from bench.profile_steps import profile_training
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import IMAGENET_MEAN, IMAGENET_STD, ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.contracts.transformations import ImageTransformations
from tasks.launch.torchrun_launcher import launch_training
from tasks.model.untrained import write_untrained_model_directory
from tasks.training.loop import autocast, make_optimizer
from tasks.vision.device_pipeline import DevicePipeline
from tasks.vision.images import ImageFiles
from tasks.vision.networks import build_network, memory_format
from tasks.vision.payloads import EncodedImageFiles, collate_payloads
from tasks.vision.transforms import train_transform

H100_GOAL = 3200.0  # the team goal for one H100 (the seed table's 16 x V100 figure)


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
    forward = torch.compile(model, dynamic=False) if compile else model
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


class Trained(NamedTuple):
    images_per_s: float  # the median of epochs 2-3: the steady state
    first_epoch_s: float  # epoch 1's seconds (with torch.compile: compiling included)
    later_epoch_s: float  # the median of the later epochs' seconds
    plan: str  # where the rank decoded its images, from its plan line


def train_through_the_worker(
    image_dir: Path,
    scratch: Path,
    architecture: str,
    size: int,
    batch: int,
    workers: int,
    decode_on: str,
    compile: str = "off",
) -> Trained:
    """A real torchrun launch of the worker, 3 epochs, and its figures."""
    name = f"{decode_on}-{compile}"
    spec = write_untrained_model_directory(scratch / f"spec-{name}", ModelSpec(architecture=architecture))
    params = TrainingParams(
        epochs=3,
        batch_size=batch,
        image_size=size,
        data_workers=workers,
        learning_rate=0.01,  # 0.1 without warmup diverged once on these noise images; the rate does not change speed
        print_frequency=10**6,
        decode_on=decode_on,
        compile=compile,
    )
    output = scratch / f"model-{name}"
    model_dir = launch_training(
        TrainingFolders(image_dir, image_dir, spec, output), params, log=lambda level, line: None
    )
    epochs = model_dir.metrics().epochs
    plan = next(
        (line for line in (output / "logs" / "driver_log_0.txt").read_text().splitlines() if "images decoded" in line),
        "",
    )
    return Trained(
        statistics.median(epoch.train_images_per_s for epoch in epochs[1:]),
        epochs[0].seconds,
        statistics.median(epoch.seconds for epoch in epochs[1:]),
        plan.split("images decoded ")[-1].split(";")[0],
    )


def baseline_worker(code: Path, image_dir: Path, scratch: Path, architecture: str, size: int, batch: int, workers: int):
    """images/s of the same launch (eager, decoded on the device) by another copy of this project (``code``: e.g.
    ``git archive`` of the commit before a change), in a process of its own that imports only that copy."""
    program = (
        "import sys; from pathlib import Path; from bench.gpu import train_through_the_worker as t; "
        "r = t(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:7]), 'device'); print(r[0])"
    )
    code = code.resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(code), os.environ.get("PYTHONPATH")) if p)}
    arguments = [str(image_dir), str(scratch), architecture, str(size), str(batch), str(workers)]
    result = subprocess.run(
        [sys.executable, "-c", program, *arguments], cwd=code, env=env, capture_output=True, text=True
    )
    if result.returncode:
        raise RuntimeError(f"the baseline in {code} failed: {result.stderr[-2000:]}")
    return float(result.stdout.split()[-1])


def measured(what: str, images_per_s: float) -> float:
    """Each figure printed as it comes: a run cut short still shows what it measured."""
    print(f"{what}: {images_per_s:.1f} images/s", flush=True)
    return images_per_s


def figures(
    images: int | None = None,
    baseline: Path | None = None,
    compile: bool = True,
    loading: bool = False,
    ceiling_seconds: float | None = None,
    profile: bool = True,
) -> list[Figure]:
    cuda = torch.cuda.is_available()
    architecture, size, batch, workers = setting()
    device = torch.cuda.get_device_name(0) if cuda else f"CPU ({os.cpu_count()} cores), GPU figure pending"
    result = []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        scratch = Path(scratch)
        image_dir = bench_images(scratch, images, size)
        count = len(ImageDirectory(image_dir))
        where = "device" if cuda else "cpu"  # decode_on="auto": the device when training on CUDA from JPEGs
        setup = f"{architecture} @{size}px, batch {batch}, {count} JPEGs {size + size // 7} px, {workers} loader workers, {device}"
        if loading:
            ceilings = {
                w: loader_ceiling(image_dir, size, batch, workers, w, ceiling_seconds or 10) for w in ("device", "cpu")
            }
            result.append(
                Figure(
                    "data-loading ceiling: decoded on the device vs by the loader's processes",
                    measured("data-loading ceiling, decoded on the device", ceilings["device"]),
                    measured("data-loading ceiling, decoded on the CPU", ceilings["cpu"]),
                    "images/s",
                    "above training",
                    notes=setup,
                )
            )
        before = None
        if baseline is not None:
            before = measured(
                f"training, the code in {baseline}",
                baseline_worker(baseline, image_dir, scratch / "baseline", architecture, size, batch, workers),
            )
        eager = train_through_the_worker(image_dir, scratch, architecture, size, batch, workers, where)
        measured(
            f"training, eager (epoch 1 {eager.first_epoch_s:.1f} s, later {eager.later_epoch_s:.1f} s)",
            eager.images_per_s,
        )
        compiled = None
        if compile:
            compiled = train_through_the_worker(image_dir, scratch, architecture, size, batch, workers, where, "on")
            measured(
                f"training, torch.compile (epoch 1 {compiled.first_epoch_s:.1f} s, later {compiled.later_epoch_s:.1f} s)",
                compiled.images_per_s,
            )
        steps = 40 if cuda else 3
        ceiling = measured("device ceiling, eager", device_ceiling(architecture, size, batch, steps=steps)[0])
        ceiling_compiled = None
        if compile:
            ceiling_compiled = measured(
                "device ceiling, torch.compile", device_ceiling(architecture, size, batch, steps=steps, compile=True)[0]
            )
        if profile:
            for compiling in (False, True) if compile else (False,):
                print(profile_training(image_dir, architecture, size, batch, workers, compiling), flush=True)
    result.append(
        Figure(
            f"training {architecture} (bf16 + channels_last on CUDA), eager",
            eager.images_per_s,
            None,
            "images/s",
            ">= 3,200 images/s on one H100" if cuda else "pending: no GPU",
            H100_GOAL if cuda else None,
            notes=f"{setup}; median of epochs 2-3; decoded {eager.plan}; {eager.images_per_s / ceiling:.0%} of the "
            f"device ceiling ({ceiling:.0f} images/s, eager)",
        )
    )
    if before is not None:
        result.append(
            Figure(
                f"training: this code vs the code in {baseline} (eager, the same launch)",
                eager.images_per_s,
                before,
                "images/s",
                "faster",
                1.0,
            )
        )
    if compiled is not None and ceiling_compiled is not None:
        saved = 1 / eager.images_per_s - 1 / compiled.images_per_s  # seconds per image
        compiling = compiled.first_epoch_s - eager.first_epoch_s
        pays_after = f"{compiling / saved:,.0f} images" if saved > 0 else "never"
        result.append(
            Figure(
                "training: torch.compile vs eager (the worker, epochs 2-3)",
                compiled.images_per_s,
                eager.images_per_s,
                "images/s",
                "kept if faster",
                1.0,
                notes=f"epoch 1 took {compiled.first_epoch_s:.1f} s compiled vs {eager.first_epoch_s:.1f} s eager: "
                f"compiling pays back after {pays_after}; {compiled.images_per_s / ceiling_compiled:.0%} of the "
                f"compiled device ceiling",
            )
        )
        result.append(
            Figure(
                "device ceiling: torch.compile vs eager", ceiling_compiled, ceiling, "images/s", "kept if faster", 1.0
            )
        )
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--baseline", type=Path, help="also train with the copy of the project in this folder")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile figures")
    parser.add_argument("--no-profile", action="store_true", help="leave out the profiles of ten steps")
    parser.add_argument("--loading", action="store_true", help="also the data-loading ceilings")
    args = parser.parse_args()
    print(table(figures(args.images, args.baseline, not args.no_compile, args.loading, profile=not args.no_profile)))
