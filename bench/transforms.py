"""What each random image transformation costs per training image on one CPU thread, at 224 px, beside the default.

    python -m bench.transforms                 # about 30 s
    python -m bench.transforms --repetitions 9

A training epoch runs the random options and normalisation on the decoded uint8 image (decoding, resizing and the
other deterministic options are done once and cached): that is what is timed, per image, for the default
(random crop with 1/8 edge padding) and for the default plus each option, alternating; the fastest repetition
counts (what the work costs: on a shared machine the slower ones measured waiting for a core as well).
One row also times the default's crop against torchvision's ``v2.RandomCrop(padding_mode="edge")``, which it
replaces because it is faster (tests/vision/test_transforms.py checks that they crop the same pixels), and one the
decode of a 640x480 JPEG to 224 px, paid once per image when the cache holds it.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from bench.harness import Figure, table
from tasks.contracts.model_directory import IMAGENET_MEAN, IMAGENET_STD
from tasks.contracts.transformations import ImageTransformations
from tasks.vision.transforms import EdgePaddedRandomCrop, train_transform

SIZE = 224
OPTIONS = {
    "random resized crop": {"random_resized_crop": True},
    "random crop, reflect padding (v2, replaces the default crop)": {"random_crop": {"padding_mode": "reflect"}},
    "horizontal flip": {"random_horizontal_flip": True},
    "rotation (15 degrees)": {"random_rotation": True},
    "affine (translate 0.1, 10 degrees)": {"random_affine": {"degrees": 10}},
    "perspective": {"random_perspective": True},
    "colour jitter (0.4, 0.4, 0.4)": {"color_jitter": True},
    "colour jitter with hue 0.1": {"color_jitter": {"hue": 0.1}},
    "random grayscale (p 0.1)": {"random_grayscale": True},
    "random erasing (p 0.5)": {"random_erasing": True},
}


def jpeg(width: int = 640, height: int = 480) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (height // 8, width // 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).resize((width, height), Image.Resampling.BILINEAR).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def fastest(runs: dict[str, Callable[[], float]], repetitions: int) -> dict[str, float]:
    results: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repetitions):
        for name, run in runs.items():
            results[name].append(run())
    return {name: min(values) for name, values in results.items()}


def per_image_us(work: Callable[[], object], images: int) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        for _ in range(images):
            work()
        return (time.perf_counter() - start) / images * 1e6

    return run


def epoch_work(transformations: ImageTransformations, pixels: torch.Tensor) -> Callable[[], object]:
    transform = train_transform(transformations, SIZE, IMAGENET_MEAN, IMAGENET_STD)
    return lambda: transform.finish(pixels)


def figures(repetitions: int = 5, images: int = 100) -> list[Figure]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    encoded = jpeg()
    default = ImageTransformations()
    decode = train_transform(default, SIZE, IMAGENET_MEAN, IMAGENET_STD).decode
    pixels = decode(Image.open(io.BytesIO(encoded)).convert("RGB"))
    baseline = per_image_us(epoch_work(default, pixels), images)
    notes = f"{SIZE} px, 1 thread, {images} images x {repetitions} alternating repetitions, fastest"
    results = []
    for name, options in OPTIONS.items():
        ours = per_image_us(epoch_work(ImageTransformations(**options), pixels), images)
        best = fastest({"option": ours, "default": baseline}, repetitions)
        results.append(
            Figure(f"per training image: default + {name}", best["option"], best["default"], "us", "-",
                   higher_is_better=False, notes=notes)
        )  # fmt: skip
    edge, torchvision_crop = EdgePaddedRandomCrop(SIZE, SIZE // 8), v2.RandomCrop(SIZE, SIZE // 8, padding_mode="edge")
    best = fastest(
        {
            "ours": per_image_us(lambda: edge(pixels), images),
            "torchvision": per_image_us(lambda: torchvision_crop(pixels), images),
        },
        repetitions,
    )
    results.append(
        Figure(
            "default crop: EdgePaddedRandomCrop vs v2.RandomCrop(edge)",
            best["ours"],
            best["torchvision"],
            "us",
            "faster",
            1.0,
            higher_is_better=False,
            notes=notes,
        )
    )
    once = fastest(
        {"decode": per_image_us(lambda: decode(Image.open(io.BytesIO(encoded)).convert("RGB")), images // 3)}, 1
    )
    results.append(
        Figure("decode a 640x480 JPEG to 224 px (once, cached)", once["decode"], None, "us", "-", notes=notes)
    )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    print(table(figures(parser.parse_args().repetitions)))
