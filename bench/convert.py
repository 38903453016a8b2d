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
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bench.harness import Figure, alternate, table
from tasks.convert.conversion import convert_to_image_directory

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


def plain_loop(source: Path, output: Path, pattern: str = "*.jpg") -> int:
    """What one would write without the stage: decode, copy and hash each image, one after another."""
    done = 0
    for path in sorted(source.rglob(pattern)):
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


def figures(images: int = 400, size: int = 640, repetitions: int = 5) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="bench-convert-") as scratch:
        scratch = Path(scratch)
        write_images(scratch / "source", images, size)
        counter = iter(range(10**6))

        def timed(run):
            def once() -> float:
                output = scratch / f"out-{next(counter)}"
                start = time.perf_counter()
                count = run(scratch / "source", output)
                rate = count / (time.perf_counter() - start)
                shutil.rmtree(output)
                return rate

            return once

        medians = alternate({"ours": timed(ours), "plain": timed(plain_loop)}, repetitions)
    return [
        Figure(
            "conversion",
            medians["ours"],
            medians["plain"],
            "images/s",
            ">= 1.8x a single-process PIL loop",
            1.8,
            notes=f"{images} JPEGs {size}x{size * 3 // 4}, {repetitions} alternating repetitions, {os.cpu_count()} CPUs",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--size", type=int, default=640, help="image width in pixels (height is 3/4 of it)")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    print(table(figures(args.images, args.size, args.repetitions)))


if __name__ == "__main__":
    main()
