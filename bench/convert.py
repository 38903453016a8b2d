"""Convert speed: ``convert_to_image_directory`` against a plain single-process PIL loop, side by side.

    python -m bench.convert                      # 400 JPEGs of 640x480, 5 alternating repetitions
    python -m bench.convert --images 1000 --size 320 --repetitions 7

Both sides decode every image in full, copy its bytes and hash them; ours also fingerprints the source
and writes the manifest. Repetitions alternate (ours, loop, ours, ...) so that both see the same page
cache and machine load; the ratio is of the median images/s. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from tasks import convert_to_image_directory

CLASSES = ("cat", "dog", "cow", "owl")


def write_images(root: Path, count: int, size: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        # Smooth gradients plus noise: JPEG sizes like photographs', not like flat colour.
        ramp = np.linspace(0, 255, size, dtype=np.float32)
        base = (ramp[None, :, None] + ramp[:, None, None] * rng.random(3)) / 2
        noise = rng.normal(0, 12, (size * 3 // 4, size, 3))
        pixels = np.clip(base[: size * 3 // 4] + noise, 0, 255).astype(np.uint8)
        folder = root / CLASSES[i % len(CLASSES)]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)


def plain_loop(source: Path, output: Path) -> int:
    """What one would write without the stage: decode, copy and hash each image, one after another."""
    done = 0
    for path in sorted(source.rglob("*.jpg")):
        with Image.open(path) as image:
            image.load()
        target = output / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        hashlib.sha256(target.read_bytes()).hexdigest()
        done += 1
    return done


def ours(source: Path, output: Path) -> int:
    return len(convert_to_image_directory(source, output))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--size", type=int, default=640, help="image width in pixels (height is 3/4 of it)")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as scratch:
        scratch = Path(scratch)
        write_images(scratch / "source", args.images, args.size)
        rates: dict[str, list[float]] = {"ours": [], "plain PIL loop": []}
        for repetition in range(args.repetitions):
            for name, run in (("ours", ours), ("plain PIL loop", plain_loop)):
                output = scratch / f"{name.replace(' ', '-')}-{repetition}"
                start = time.perf_counter()
                count = run(scratch / "source", output)
                rates[name].append(count / (time.perf_counter() - start))
                shutil.rmtree(output)
        print(f"{args.images} JPEGs of {args.size}x{args.size * 3 // 4}, {args.repetitions} alternating repetitions, "
              f"{os.cpu_count()} CPUs")  # fmt: skip
        medians = {name: statistics.median(values) for name, values in rates.items()}
        for name, values in rates.items():
            runs = ", ".join(f"{v:.0f}" for v in values)
            print(f"  {name:15s} median {medians[name]:8.1f} images/s  ({runs})")
        print(f"  ratio ours / plain PIL loop: {medians['ours'] / medians['plain PIL loop']:.2f}x")


if __name__ == "__main__":
    main()
