"""Where a training step's time goes: the worker's own loop (``train_one_epoch``, its data, model and optimiser as
the worker builds them) run in this process for a few warm-up batches, then ten batches under the torch profiler.
The summary says how busy the device was (the union of its kernels' intervals over the wall time), how its kernel
time splits between the network's step and the image pipeline, and how long the host waited for each batch and
spent turning it into the network's input; the profiler's own table of the costliest operations follows.

    python -m bench.profile_steps --images 4096              # makes JPEGs, ResNet-50 @224, batch 256 on CUDA
    python -m bench.profile_steps --compile --trace t.json   # with torch.compile; a trace for chrome://tracing

``bench.gpu`` calls ``profile_training`` on its own JPEGs; both take the setting and the JPEGs from
``bench.gpu_inputs``. On the CPU it runs ResNet-18 @64 (the device figures are then the CPU's).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from bench.gpu_inputs import bench_images, setting
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelSpec, TrainedModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.training.data import TrainingData
from tasks.training.distributed import DistributedEnv, choose_device
from tasks.training.lifeline import Heartbeat
from tasks.training.loop import EpochContext, compiled_model, make_optimizer, train_one_epoch
from tasks.vision.networks import build_network, memory_format

# Kernels of the image pipeline (nvJPEG's, the resize, the crop-and-flip gather, the uint8-to-float normalising),
# told apart from the network's by name; everything else on the device is the training step.
PIPELINE_KERNELS = ("nvjpeg", "jpeg", "upsample", "interpolate", "index_kernel", "gather", "copy_kernel")


class Batches:
    """``count`` batches taken from an iterator that is already running, each fetch labelled for the profiler."""

    def __init__(self, batches: Iterator, count: int) -> None:
        self.batches, self.count = batches, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator:
        for _ in range(self.count):
            with record_function("host: wait for the next batch"):
                batch = next(self.batches)
            yield batch


def labelled(model_input):
    def to_network(images):
        with record_function("host: augment + normalise"):
            return model_input(images)

    return to_network


def intervals_busy(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    busy, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def device_kernels(prof) -> list:
    return [e for e in prof.events() if e.device_type.name in ("CUDA", "PrivateUse1") and e.time_range.elapsed_us() > 0]


def summary(prof, wall_s: float, steps: int, batch: int) -> str:
    kernels = device_kernels(prof)
    pipeline = [k for k in kernels if any(word in k.name.lower() for word in PIPELINE_KERNELS)]
    spans = [(k.time_range.start, k.time_range.end) for k in kernels]
    busy_s = intervals_busy(spans) / 1e6
    kernel_s = sum(k.time_range.elapsed_us() for k in kernels) / 1e6
    pipeline_s = sum(k.time_range.elapsed_us() for k in pipeline) / 1e6
    host = {e.key: e.cpu_time_total / 1e6 for e in prof.key_averages() if e.key.startswith("host: ")}
    per_step = 1000 / steps
    lines = [
        f"{steps} steps of {batch} images in {wall_s * 1000:.0f} ms: {steps * batch / wall_s:.0f} images/s, "
        f"{wall_s * per_step:.1f} ms/step",
        f"device busy {busy_s / wall_s:.0%} of the wall time ({busy_s * per_step:.1f} ms/step; idle "
        f"{(wall_s - busy_s) * per_step:.1f} ms/step)",
        f"device kernel time {kernel_s * per_step:.1f} ms/step: training step {(kernel_s - pipeline_s) * per_step:.1f}, "
        f"image pipeline {pipeline_s * per_step:.1f} (its streams overlap the step's)",
    ]
    lines += [f"{name} {seconds * per_step:.1f} ms/step" for name, seconds in sorted(host.items())]
    sort = "self_device_time_total" if kernels else "self_cpu_time_total"
    try:
        lines.append(prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=60))
    except (AttributeError, KeyError):  # older torch names it self_cuda_time_total
        lines.append(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15))
    return "\n".join(lines)


def profile_training(
    image_dir: Path,
    architecture: str,
    size: int,
    batch: int,
    workers: int,
    compile: bool = False,
    steps: int = 10,
    trace: Path | None = None,
) -> str:
    """The summary of ``steps`` profiled training steps (after a warm-up of a few batches, compiling included)."""
    env = DistributedEnv.from_environ()
    params = TrainingParams(
        batch_size=batch,
        image_size=size,
        data_workers=workers,
        learning_rate=0.01,
        print_frequency=10**6,
        compile="on" if compile else "off",
    )
    device = choose_device(env, params)
    images = ImageDirectory(image_dir)
    spec = TrainedModelSpec(
        **ModelSpec(architecture=architecture).model_dump(), num_classes=len(images.classes), image_size=size
    )
    data = TrainingData.load(images, images, spec, params, env, device)
    model = build_network(spec, spec.num_classes).to(device, memory_format=memory_format(device))
    optimizer = make_optimizer(model, params.learning_rate, params, architecture)
    ctx = EpochContext(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        criterion=nn.CrossEntropyLoss(),
        device=device,
        params=params,
        heartbeat=Heartbeat(Path(tempfile.gettempdir()), 0),  # not started: progress is only recorded
        world_size=1,
        compiled=compiled_model(model, params),
    )
    total = len(data.train_loader)
    warm = min(3, max(1, total - steps))
    steps = max(1, min(steps, total - warm))
    running = iter(data.train_loader)
    model_input = labelled(data.train_input)
    train_one_epoch(ctx, Batches(running, warm), model_input, epoch=0)  # cuDNN's search, compiling, the pipeline
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        train_one_epoch(ctx, Batches(running, steps), model_input, epoch=0)
        synchronize()
        wall = time.perf_counter() - started
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    for _ in running:  # let the loader finish its epoch: its threads and processes end cleanly
        pass
    mode = "torch.compile" if compile else "eager"
    return f"{architecture} @{size}px, batch {batch}, {mode}, on {device}:\n" + summary(prof, wall, steps, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=None, help="JPEGs to make (default 4,096 on CUDA, 96 on CPU)")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--trace", type=Path, help="write the profiler's trace here (chrome://tracing, Perfetto)")
    args = parser.parse_args()
    architecture, size, batch, workers = setting()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as scratch:
        image_dir = bench_images(Path(scratch), args.images, size)
        print(profile_training(image_dir, architecture, size, batch, workers, args.compile, trace=args.trace))


if __name__ == "__main__":
    main()
