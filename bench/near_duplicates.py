"""Near-duplicates (tasks/near_duplicates): how well the perceptual hash groups copies and keeps different photos
apart, and what grouping costs the split and conversion. Asserts nothing; prints what it measured.

    python -m bench.near_duplicates                  # about a minute on 2 cores
    python -m bench.near_duplicates --images 1000000 # the split's cost at a million images

1. Real photographs: scikit-learn's two sample photos and matplotlib's Grace Hopper, plus scikit-image's bundled
   photos when it is installed (``pip install -e '.[bench]'``). "Different pictures" are the photos and their
   quarters (quarters of one photo share its texture and light: a hard case). For each kind of copy (resized,
   re-compressed, cropped, shifted as a burst's next shot), the share of copies within the distance of their
   original; for the different pictures, the pairs within it (false merges), per distance.
2. The split at N images, side by side in one process: near_duplicate_distance -1 (identical files only, the split
   before near-duplicates) and the default, on one ImageDirectory whose hashes come in bursts (a third of the
   images have a twin a few bits away). The split's files are hard links to tiny files: its own work, not disk's.
3. Conversion of 3,000 x 2,000 JPEGs with the hash and with it stubbed out (the only stand-in here: it isolates
   the hash's cost), alternating.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from bench.harness import alternate
from tasks.near_duplicates import DEFAULT_DISTANCE, MIN_SIDE, hamming, perceptual_hash

DISTANCES = (4, 6, 8, 10, 12)


def photos() -> dict[str, Image.Image]:
    from tests.helpers import sample_photos

    found = sample_photos()
    try:
        import skimage.data
    except ImportError:
        print("scikit-image is not installed: 3 photos only (pip install -e '.[bench]' for 20 more)")
        return found
    for name in (
        "astronaut camera chelsea coffee rocket brick grass gravel moon page text coins clock horse cell retina "
        "hubble_deep_field immunohistochemistry colorwheel microaneurysms"
    ).split():
        pixels = getattr(skimage.data, name)()
        found[name] = Image.fromarray((pixels * 255).astype(np.uint8) if pixels.dtype == bool else pixels)
    return found


def _jpeg(image: Image.Image, quality: int) -> Image.Image:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return Image.open(buffer)


def _resized(image: Image.Image, share: float) -> Image.Image:
    return image.resize((round(image.width * share), round(image.height * share)), Image.Resampling.LANCZOS)


def _cropped(image: Image.Image, share: float) -> Image.Image:
    dx, dy = round(image.width * share), round(image.height * share)
    return image.crop((dx, dy, image.width - dx, image.height - dy))


def _shifted(image: Image.Image, share: float) -> Image.Image:
    return image.crop((round(image.width * share), round(image.height * share), image.width, image.height))


COPIES: dict[str, Callable[[Image.Image], Image.Image]] = {
    "resized to 50%": lambda p: _resized(p, 0.5),
    "JPEG quality 80": lambda p: _jpeg(p, 80),
    "JPEG quality 40": lambda p: _jpeg(p, 40),
    "resized to 50%, JPEG 50": lambda p: _jpeg(_resized(p, 0.5), 50),
    "cropped 2% a side": lambda p: _cropped(p, 0.02),
    "cropped 5% a side": lambda p: _cropped(p, 0.05),
    "shifted 3% (a burst's next shot)": lambda p: _shifted(p, 0.03),
    "shifted 2%, resized 50%, JPEG 70": lambda p: _jpeg(_resized(_shifted(p, 0.02), 0.5), 70),
}


def quality() -> list[str]:
    found = photos()
    quarters = []
    for photo in found.values():
        w, h = photo.size
        quarters += [photo.crop((x, y, x + w // 2, y + h // 2)) for x in (0, w // 2) for y in (0, h // 2)]
    header = "| | " + " | ".join(f"≤ {d} bits" for d in DISTANCES) + " |"
    lines = [f"{len(found)} photos ({', '.join(found)}); {len(quarters)} quarters", "", header]
    lines.append("|---|" + "---|" * len(DISTANCES))
    for kind, pictures in (("photos", list(found.values())), ("quarters", quarters)):
        hashes = np.array([perceptual_hash(p) for p in pictures], dtype=np.uint64)
        bits = hamming(hashes[:, None], hashes[None, :])[np.triu_indices(len(pictures), 1)]
        cells = [f"{int((bits <= d).sum())} ({(bits <= d).mean():.2%})" for d in DISTANCES]
        label = f"different {kind}: pairs grouped (false merges) of {len(bits):,}, the closest {bits.min()} bits"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(f"| {digits_line()} | " + " | ".join(digits_cells()) + " |")
    for name, copy in COPIES.items():
        pairs = [(p, copy(p)) for p in found.values()]
        pairs = [(a, b) for a, b in pairs if min(b.size) >= MIN_SIDE]  # a copy under 32 px gets no hash
        bits = np.array([int(hamming(np.uint64(perceptual_hash(a)), np.uint64(perceptual_hash(b)))) for a, b in pairs])
        cells = [f"{(bits <= d).mean():.0%}" for d in DISTANCES]
        lines.append(f"| {name}: copies grouped with their photo ({len(bits)}) | " + " | ".join(cells) + " |")
    return lines


def _digit_bits() -> np.ndarray:
    """Bits apart of each pair of scikit-learn's 8x8 digits, hashed as if large enough (imagehash.phash itself;
    the product gives images under MIN_SIDE no hash), and whether the pair is of one class."""
    import imagehash
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.rint(digits.images * (255 / 16)).astype(np.uint8)
    bits = np.array([imagehash.phash(Image.fromarray(p, mode="L")).hash.ravel() for p in pixels])
    first, second = np.triu_indices(len(pixels), 1)
    apart = (bits[first] != bits[second]).sum(axis=1)
    return apart, digits.target[first] == digits.target[second]


def digits_line() -> str:
    return "different 8x8 digits (not hashed by the product: under 32 px): pairs within, of one class / of two"


def digits_cells() -> list[str]:
    apart, same = _digit_bits()
    return [f"{int(((apart <= d) & same).sum())} / {int(((apart <= d) & ~same).sum())}" for d in DISTANCES]


def burst_directory(root: Path, count: int, seed: int = 0):
    """An ImageDirectory of ``count`` tiny files in 10 classes whose index holds bursty perceptual hashes."""
    from tasks.contracts.image_directory import ImageDirectory, ImageDirectoryManifest
    from tasks.contracts.image_index import ImageIndex, Strings

    rng = np.random.default_rng(seed)
    classes = [f"class-{c}" for c in range(10)]
    labels = np.arange(count, dtype=np.int32) % 10
    hashes = rng.integers(1, 2**63, count, dtype=np.uint64) | (rng.integers(0, 2, count, dtype=np.uint64) << 63)
    twins = np.flatnonzero(rng.random(count) < 1 / 3)  # a third are a burst's second shot of the image before
    twins = twins[twins > 0]
    flips = np.bitwise_and.reduce(rng.integers(0, 2**63, (4, len(twins)), dtype=np.uint64), axis=0)  # ~4 bits
    hashes[twins] = hashes[twins - 1] ^ flips
    labels[twins] = labels[twins - 1]
    paths = [f"{classes[label]}/{i:07d}.png" for i, label in enumerate(labels.tolist())]
    for name in classes:
        (root / name).mkdir(parents=True)
    for i, path in enumerate(paths):
        (root / path).write_bytes(i.to_bytes(4, "little"))
    encoded = [p.encode() for p in paths]
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    index = ImageIndex(
        path=Strings(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets),
        source_path=Strings(np.zeros(0, dtype=np.uint8), np.zeros(count + 1, dtype=np.int64)),
        label=labels,
        sha256=rng.integers(0, 256, (count, 32), dtype=np.uint8),
        size_bytes=np.full(count, 4, dtype=np.int64),
        width=np.full(count, 64, dtype=np.int32),
        height=np.full(count, 64, dtype=np.int32),
        mode=np.full(count, b"RGB", dtype="S8"),
        orientation=np.ones(count, dtype=np.int8),
        perceptual_hash=hashes,
    )
    counts = np.bincount(labels, minlength=10)
    manifest = ImageDirectoryManifest(
        labeled=True, classes=classes, counts={c: int(n) for c, n in zip(classes, counts)}, source="bench"
    )
    ImageDirectory.write(root, manifest, index)
    return ImageDirectory(root)


def split_cost(count: int, repetitions: int) -> list[str]:
    from tasks.data.split import Groups, split_image_directory
    from tasks.near_duplicates import near_pairs

    with tempfile.TemporaryDirectory(prefix="bench-near-duplicates-") as scratch:
        scratch = Path(scratch)
        source = burst_directory(scratch / "source", count)
        runs = 0

        def timed(distance: int) -> Callable[[], float]:
            def run() -> float:
                nonlocal runs
                runs += 1
                started = time.perf_counter()
                split_image_directory(source, scratch / f"a{runs}", scratch / f"b{runs}", 0.8, 1, distance)
                return time.perf_counter() - started

            return run

        seconds = alternate({"-1": timed(-1), "default": timed(DEFAULT_DISTANCE)}, repetitions)
        started = time.perf_counter()
        pairs = near_pairs(source.index.perceptual_hash, DEFAULT_DISTANCE)
        lookup = time.perf_counter() - started
        groups = Groups(source.index)
        near = groups.near_duplicate()
    return [
        f"split of {count:,} images (80/20), median of {repetitions}: identical files only {seconds['-1']:.2f} s, "
        f"near-duplicates within {DEFAULT_DISTANCE} bits {seconds['default']:.2f} s: "
        f"{seconds['default'] / seconds['-1']:.2f}x",
        f"  near_pairs alone {lookup:.2f} s: {len(pairs):,} pairs; {len(near):,} near-duplicate groups "
        f"({int(groups.sizes[near].sum()):,} images), the largest {int(groups.sizes.max())}",
    ]


def conversion_cost(count: int, repetitions: int) -> str:
    import tasks.convert.storing as storing
    from tasks.convert.conversion import convert_to_image_directory

    with tempfile.TemporaryDirectory(prefix="bench-near-duplicates-") as scratch:
        scratch = Path(scratch)
        rng = np.random.default_rng(0)
        for i in range(count):
            small = rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)
            path = scratch / "photos" / f"class-{i % 2}" / f"IMG_{i:04d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(small).resize((3000, 2000), Image.Resampling.BICUBIC).save(path, quality=90)
        runs = 0
        hashing = storing.perceptual_hash

        def timed(hash_function) -> Callable[[], float]:
            def run() -> float:
                nonlocal runs
                runs += 1
                storing.perceptual_hash = hash_function
                try:
                    started = time.perf_counter()
                    convert_to_image_directory(scratch / "photos", scratch / f"out{runs}")
                    return time.perf_counter() - started
                finally:
                    storing.perceptual_hash = hashing

            return run

        seconds = alternate({"without": timed(lambda image: 0), "with": timed(hashing)}, repetitions)
    return (
        f"conversion of {count} JPEGs of 3,000 x 2,000, median of {repetitions}: without the hash "
        f"{seconds['without']:.2f} s, with it {seconds['with']:.2f} s: {seconds['with'] / seconds['without']:.2f}x "
        f"({(seconds['with'] - seconds['without']) / count * 1000:.1f} ms an image)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=100_000, help="images in the split's directory")
    parser.add_argument("--photos", type=int, default=40, help="JPEGs converted for the hash's cost")
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(quality()))
    print()
    print("\n".join(split_cost(args.images, args.repetitions)))
    print(conversion_cost(args.photos, args.repetitions))


if __name__ == "__main__":
    main()
