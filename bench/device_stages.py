"""Where ``decode_on="device"`` spends its time, stage by stage: for each stage of ``DevicePipeline`` on batches of
JPEGs already in memory, the wall time per batch and the host CPU time of the calling thread in it; on CUDA, then,
ResNet-50's training step alone and beside a thread decoding as ``DecodedAhead`` does. On the CPU a stage's host
time below its wall time is time spent waiting; on CUDA the host spins while it waits for the device
(``synchronize``), so the host column reads about 100% there, and the row beside training is the one that says
whether decoding competes with the step. Figures print as they come.

    python -m bench.device_stages                  # 1,024 JPEGs of 256 px, batches of 256, ResNet's 224 px crop
    python -m bench.device_stages --images 16 --batch 8 --batches 1   # the CPU smoke run of tests/bench/
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.gpu import device_ceiling, write_jpegs
from tasks.contracts.model_directory import IMAGENET_MEAN, IMAGENET_STD
from tasks.contracts.transformations import ImageTransformations
from tasks.vision.device_pipeline import DevicePipeline
from tasks.vision.payloads import EncodedImageFiles, PackedPayloads
from tasks.vision.transforms import train_transform


def timed(stage: Callable[[], object], device: torch.device, repetitions: int) -> tuple[float, float]:
    """(wall ms, host CPU ms of this thread) per call of ``stage``, synchronised with the device after each."""
    stage()  # warm-up: nvJPEG's handles, the allocator
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(repetitions):
        stage()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return (time.perf_counter() - wall) * 1000 / repetitions, (time.thread_time() - cpu) * 1000 / repetitions


def stages(images: int = 1024, side: int = 256, size: int = 224, batch: int = 256, batches: int = 8) -> list[str]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = train_transform(ImageTransformations(), size, IMAGENET_MEAN, IMAGENET_STD)
    pipeline = DevicePipeline(transform, ImageTransformations(), size, device)
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        write_jpegs(root, images, side)
        files = EncodedImageFiles([(path, 0) for path in sorted(root.rglob("*.jpg"))], transform)
        payloads = [files[i][0] for i in range(len(files))]
    packed = PackedPayloads.pack(payloads[:batch])  # as a loader process hands a batch over, pinned on CUDA
    one = PackedPayloads(packed.data.pin_memory(), packed.shapes) if device.type == "cuda" else packed
    decoded = pipeline.decode(one)
    rows = []
    for name, stage in (
        ("decode_jpeg (batched)", lambda: pipeline._decode_jpegs(one.unpack())),
        ("decode + resize (decode)", lambda: pipeline.decode(one)),
        ("crop + flip (augment)", lambda: pipeline.augment(decoded)),
        ("augment + normalise (finish)", lambda: pipeline.finish(decoded)),
        ("the whole pipeline", lambda: pipeline(one)),
    ):
        wall, cpu = timed(stage, device, batches)
        row = (
            f"{name:30s} {wall:8.1f} ms/batch {batch * 1000 / wall:9,.0f} images/s   host CPU {cpu:8.1f} ms "
            f"({cpu / wall:4.0%} of wall)"
        )
        print(row, flush=True)
        rows.append(row)
    if device.type == "cuda":
        rows.append(beside_training(pipeline, one, device))
    return rows


def beside_training(pipeline: DevicePipeline, one: PackedPayloads, device: torch.device) -> str:
    """ResNet-50's training step (``bench.gpu.device_ceiling``) alone, then with a thread decoding and resizing
    batches on a stream of its own as ``DecodedAhead`` does: how much each slows the other."""
    batch = len(one.shapes)
    alone = device_ceiling("resnet50", 224, batch, steps=30)[0]
    decoded, stop = [0], threading.Event()

    def decode_ahead() -> None:
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            while not stop.is_set():
                pipeline.decode(one)
                stream.synchronize()
                decoded[0] += batch

    thread = threading.Thread(target=decode_ahead)
    started = time.perf_counter()
    thread.start()
    try:
        beside = device_ceiling("resnet50", 224, batch, steps=30)[0]
    finally:
        stop.set()
        thread.join()
    decoding = decoded[0] / (time.perf_counter() - started)
    row = (
        f"training step alone {alone:,.0f} images/s; beside a decoding thread {beside:,.0f} images/s "
        f"({beside / alone:.2f}x), the thread decoding {decoding:,.0f} images/s meanwhile"
    )
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--batches", type=int, default=8, help="timed calls per stage")
    args = parser.parse_args(argv)
    print(f"device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, batch {args.batch}")
    stages(images=args.images, batch=args.batch, batches=args.batches)


if __name__ == "__main__":
    main()
