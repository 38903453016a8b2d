"""The one inference core against this machine's ceiling, side by side in one run: the ceiling itself, scoring at
224 px as a share of it (two runs), and int8 against fp32 (speed, and top-1 on the digits and on real photos).
Prints one table; asserts nothing.

    python -m bench.inference                          # about 12 minutes on 2 CPU cores (two trainings included)
    python -m bench.inference --skip-top1              # the speed figures only (about 4 minutes)
    python -m bench.inference --skip-speed             # int8's top-1 only (two trainings)

**The ceiling** is what one process can do at best here: a full batch of JPEG photos' bytes decoded (the one decode,
``LoadedModel.decode``) and then run (the one forward pass, ``LoadedModel.probabilities``), in turn, on one Python
thread, at the best of torch's intra-op thread settings (1, 2, 3, 4, 8, … and the machine's cores; on a GPU torch's
own), in images/s. Nothing an inference path adds (reading files, batching requests, HTTP) can make it faster; each
figure is given as a share of the ceiling measured in the same run, at the batch size that path uses (scoring 64,
the endpoint 16).

The photos: the crops of scikit-learn's two sample photographs and matplotlib's portrait of Grace Hopper (real
JPEGs, quality 90), each a random crop resized to 256 px, three classes: 384 for the speed figures (a scoring's
start, about a second, then weighs little), ``--photos`` per class for training and half as many for validation.
ResNet-18 at 224 px, random weights for the speed figures (speed does not depend on what a network learned).

**int8** (tasks/inference/int8.py: ONNX Runtime's static quantization, calibrated on the validation images) against
fp32 (the network traced): the ceiling of each (batch 16), scoring of each (batch 64), and top-1 on the validation
images of two trained models: the photos' ResNet-18 at 224 px, and ResNet-18 on the bundled digits at 32 px
(their own size). Both trained here through the real stages (``bench.transfer.train``: convert, model spec, the
torchrun worker), 3 epochs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from bench.harness import Figure, alternate, table
from bench.score import images_per_s, random_model_directory
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelDirectory, ModelSpec
from tasks.contracts.training_config import TrainingParams
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.datasets import export_digits
from tasks.evaluation.score import score_images
from tasks.inference.int8 import int8_unavailable
from tasks.inference.loaded import LoadedModel

SIDE = 224
SERVING_BATCH, SCORING_BATCH = 16, 64
SPEED_IMAGES = 384


def write_photos(root: Path, per_class: int, seed: int) -> Path:
    """``per_class`` random crops of each real photo, 256 px JPEGs, a folder per photo."""
    from tests.helpers import sample_photos

    rng = np.random.default_rng(seed)
    for name, photo in sample_photos().items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            side = int(rng.integers(min(photo.size) // 2, min(photo.size)))
            x, y = rng.integers(0, photo.width - side + 1), rng.integers(0, photo.height - side + 1)
            crop = photo.crop((int(x), int(y), int(x) + side, int(y) + side)).resize((256, 256))
            crop.save(root / name / f"{name}_{i:03d}.jpg", quality=90)
    return root


def encoded_batch(images: ImageDirectory, size: int) -> list[bytes]:
    paths = [path for path, _ in images.samples()]
    return [Path(paths[i % len(paths)]).read_bytes() for i in range(size)]


def in_turn(model: LoadedModel, batch: list[bytes], seconds: float) -> float:
    """images/s of decoding a batch then running it, again and again for ``seconds``."""
    for _ in range(3):  # warm: allocations, and the traced graph optimised over its first runs
        model.probabilities([model.decode(data) for data in batch])
    started, done = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        model.probabilities([model.decode(data) for data in batch])
        done += len(batch)
    return done / (time.perf_counter() - started)


def thread_settings(model: LoadedModel) -> list[int]:
    """The intra-op thread counts the ceiling tries: on the CPU 1, 2, 4, … and the machine's cores (every count up
    to 4); on a GPU torch's own (its threads only feed the device)."""
    if model.device.type != "cpu":
        return [torch.get_num_threads()]
    cores = os.cpu_count() or 1
    return sorted({2**k for k in range(cores.bit_length()) if 2**k <= cores} | {min(cores, 3), cores})


def ceiling(model: LoadedModel, batch: list[bytes], seconds: float) -> tuple[float, int]:
    """(the best images/s of ``in_turn``, the torch thread count that gave it); torch's threads are left as found."""
    found, best = torch.get_num_threads(), (0.0, 0)
    try:
        for threads in thread_settings(model):
            torch.set_num_threads(threads)
            best = max(best, (in_turn(model, batch, seconds), threads))
    finally:
        torch.set_num_threads(found)
    return best


def top1(model: LoadedModel, images: ImageDirectory) -> float:
    samples = list(images.samples())
    right = 0
    for start in range(0, len(samples), SCORING_BATCH):
        chunk = samples[start : start + SCORING_BATCH]
        probabilities = model.probabilities([model.decode(path) for path, _ in chunk])
        predicted = [model.classes[i] for i in probabilities.argmax(axis=1)]
        right += sum(label == images.classes[index] for label, (_, index) in zip(predicted, chunk, strict=True))
    return right / len(samples)


def trained(scratch: Path, name: str, train_root: Path, validation_root: Path, image_size: int) -> ModelDirectory:
    from bench.transfer import train

    out = scratch / name
    params = TrainingParams(epochs=3, patience=3, device="cpu", image_size=image_size)
    best = train(train_root, validation_root, ModelSpec(architecture="resnet18", pretrained=False), params, out)
    print(f"{name}: trained, best top-1 {best:.4f}", flush=True)
    return ModelDirectory(out / "model")


def at_threads(threads: int, run: Callable[[], float]) -> Callable[[], float]:
    def measured() -> float:
        found = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return run()
        finally:
            torch.set_num_threads(found)

    return measured


def speed_figures(scratch: Path, photos: ImageDirectory, seconds: float, repetitions: int) -> list[Figure]:
    """The ceiling's best thread setting found once per batch size; then each figure against the ceiling (or int8
    against fp32) in alternating repetitions at that setting, medians compared: a change in the machine's load falls
    on both sides alike."""
    model_dir = random_model_directory(scratch / "model-224", "resnet18", photos.classes, SIDE)
    fp32 = LoadedModel(model_dir)
    int8 = LoadedModel(model_dir, precision="int8", calibration=photos)
    serving, scoring = encoded_batch(photos, SERVING_BATCH), encoded_batch(photos, SCORING_BATCH)
    top, threads = ceiling(fp32, serving, seconds)
    top64, threads64 = ceiling(fp32, scoring, seconds)
    print(f"ceiling at {SIDE} px: batch 16 {top:.1f} images/s ({threads} threads), batch 64 {top64:.1f} ({threads64})")
    notes = f"ResNet-18 @{SIDE}, {os.cpu_count()} cores"
    figures = [
        Figure(f"ceiling at {SIDE} px, batch 16", top, None, "images/s", "the most one process does", notes=f"{notes}, best at {threads} torch threads"),
        Figure(f"ceiling at {SIDE} px, batch 64", top64, None, "images/s", "the most one process does", notes=f"{notes}, best at {threads64} torch threads"),
    ]  # fmt: skip

    def scored(precision: str = "fp32") -> float:
        return images_per_s(
            lambda: score_images(model_dir, photos, batch_size=SCORING_BATCH, precision=precision), len(photos)
        )

    for run in (1, 2):
        side = alternate(
            {
                "ceiling": at_threads(threads64, lambda: in_turn(fp32, scoring, seconds)),
                "scoring": at_threads(threads64, scored),
            },
            repetitions,
        )
        figures.append(Figure(f"scoring at {SIDE} px vs the ceiling, run {run}", side["scoring"], side["ceiling"], "images/s", ">= 90% of the ceiling", 0.9, notes=f"{len(photos)} JPEGs, batch 64, {threads64} torch threads, {repetitions} alternating repetitions"))  # fmt: skip
    if int8.precision != "int8":
        print(f"int8: {int8_unavailable()}; no int8 figures", flush=True)
        return figures
    speeds = alternate(
        {
            "fp32": at_threads(threads, lambda: in_turn(fp32, serving, seconds)),
            "int8": at_threads(threads, lambda: in_turn(int8, serving, seconds)),
        },
        repetitions,
    )
    figures.append(Figure(f"int8 vs fp32, decode + forward at {SIDE} px, batch 16", speeds["int8"], speeds["fp32"], "images/s", ">= 1.8x fp32", 1.8, notes=f"{repetitions} alternating repetitions; int8 is {speeds['int8'] / top:.2f}x the fp32 ceiling"))  # fmt: skip
    scores = alternate(
        {"fp32": at_threads(threads64, scored), "int8": at_threads(threads64, lambda: scored("int8"))}, repetitions
    )
    figures.append(Figure(f"int8 vs fp32 scoring at {SIDE} px", scores["int8"], scores["fp32"], "images/s", ">= 1.8x fp32", 1.8, notes=f"{len(photos)} JPEGs, batch 64, {repetitions} alternating repetitions"))  # fmt: skip
    return figures


def top1_figures(scratch: Path, photos: tuple[Path, Path]) -> list[Figure]:
    digits_train, digits_validation = export_digits(scratch / "digits")
    models = {
        "real photos @224": trained(scratch, "photos", *photos, SIDE),
        "digits @32": trained(scratch, "digits", digits_train, digits_validation, 32),
    }
    figures = []
    for what, model_dir in models.items():
        validation = ImageDirectory(model_dir.root.parent / "data" / "validation")
        fp32 = LoadedModel(model_dir)
        int8 = LoadedModel(model_dir, precision="int8", calibration=validation)
        if int8.precision != "int8":
            continue
        a, b = top1(fp32, validation), top1(int8, validation)
        print(f"top-1 on {what}: fp32 {a:.4f}, int8 {b:.4f}", flush=True)
        figures.append(
            Figure(
                f"int8 top-1 on {what} vs fp32",
                b,
                a,
                "top-1",
                "within 0.5 points of fp32",
                1.0,
                allowance=0.005,
                notes=f"{len(validation)} validation images, calibrated on them",
            )
        )
    return figures


def figures(
    seconds: float = 8.0,
    repetitions: int = 3,
    photos_per_class: int = 60,
    skip_top1: bool = False,
    skip_speed: bool = False,
) -> list[Figure]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-inference-") as scratch:
        scratch = Path(scratch)
        if not skip_speed:
            # Enough images that a scoring's start (loading and tracing the model, about a second) weighs little.
            speed_root = write_photos(scratch / "photos-src" / "speed", SPEED_IMAGES // 3, seed=3)
            speed = convert_to_image_directory(speed_root, scratch / "speed")
            results += speed_figures(scratch, speed, seconds, repetitions)
        if not skip_top1:
            train_root = write_photos(scratch / "photos-src" / "train", photos_per_class, seed=1)
            validation_root = write_photos(scratch / "photos-src" / "validation", photos_per_class // 2, seed=2)
            results += top1_figures(scratch, (train_root, validation_root))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.inference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="each measurement's length (8)")
    parser.add_argument("--repetitions", type=int, default=3, help="alternating repetitions of each comparison (3)")
    parser.add_argument("--photos", type=int, default=60, help="training crops per class (60; validation: half)")
    parser.add_argument("--skip-top1", action="store_true", help="the speed figures only: no training")
    parser.add_argument("--skip-speed", action="store_true", help="the top-1 figures only (accuracy: any load will do)")
    args = parser.parse_args(argv)
    print(table(figures(args.seconds, args.repetitions, args.photos, args.skip_top1, args.skip_speed)))


if __name__ == "__main__":
    main()
