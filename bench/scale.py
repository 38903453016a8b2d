"""Scale: time per image and memory of each stage as the number of images grows, beside ImageFolder and a PIL loop.

    python -m bench.scale                          # N = 10,000, 100,000 and 300,000 tiny PNGs (13 min on 2 cores)
    python -m bench.scale --sizes 2000 10000       # quicker, for a first look
    python -m bench.scale --imagenet               # and N = 1,281,167 (ImageNet's training set), if the disk allows

For each N, synthetic 16x16 PNGs in 10 class folders (every one distinct) are written once, then each stage runs
in a fresh process that imports only what the stage needs (no torch for conversion), so that its peak resident
memory (VmHWM, ``tasks.memory.peak_rss_mb``) is its own; "peak +X MB" is that peak above the process after its
imports, "process" the peak itself (conversion's flatness is judged on the process's peak, as issue 23 measured it):

- plain: a single-process PIL loop that opens, decodes, copies and hashes each image (what conversion must do);
- convert: ``convert_to_image_directory``;
- split: ``split_image_directory`` at 80/20; validate: ``check_training_data`` on the two sides (leakage by hash);
- index: what one training rank holds to know its images: the ImageDirectory's samples in ``ImageFiles`` and a
  ``DistributedSampler`` of 2 ranks, the epoch's order drawn (timed: the index load), then each of the rank's
  samples looked up once, as an epoch does (the memory-mapped pages it touches count as held); imagefolder:
  torchvision's ``ImageFolder`` on the same folder with the same sampler and lookups (the baseline);
- score: ``score_chunks`` written by ``write_score_chunks``, as the stage does, with a small network (trained once
  for one epoch on 1,000 images).

Printed: a table per stage and N (microseconds per image, peak and held memory), each stage's memory slope per
image and its extrapolation to ImageNet's 1.28 million images, and the figures with their targets (issue 23):
conversion <= 2x the plain loop per image, the conversion process's peak RSS flat in N (within 20 %), index memory per
rank <= 1.5x ImageFolder's, index load under 1 s at the largest N. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

from bench.harness import Figure, aligned, in_fresh_process, table
from tasks.memory import peak_rss_mb

CLASSES = 10
SIDE = 16
IMAGENET = 1_281_167
DEFAULT_SIZES = [10_000, 100_000, 300_000]
STAGES = ("plain", "convert", "split", "validate", "index", "imagefolder", "score")


def _write_chunk(args: tuple[str, int, int]) -> None:
    import numpy as np
    from PIL import Image

    root, start, stop = args
    rng = np.random.default_rng(start)
    for i in range(start, stop):
        pixels = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
        pixels[0, :4] = np.frombuffer(i.to_bytes(12, "little"), dtype=np.uint8).reshape(4, 3)  # distinct bytes
        Image.fromarray(pixels).save(Path(root) / f"class-{i % CLASSES}" / f"{i:07d}.png")


def write_images(root: Path, count: int) -> None:
    for c in range(CLASSES):
        (root / f"class-{c}").mkdir(parents=True, exist_ok=True)
    chunk = 5000
    with Pool(os.cpu_count()) as pool:
        pool.map(_write_chunk, [(str(root), s, min(s + chunk, count)) for s in range(0, count, chunk)])


def rss_mb() -> float:
    """This process's resident memory now."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# --- one stage, in its own process --------------------------------------------------------------------------


def run_stage(stage: str, work: Path) -> dict:
    """Stage ``stage`` on the data under ``work``: seconds, images, peak and held memory (MB above the process
    after its imports), and the process's own peak resident memory (MB). Each stage imports only what it needs
    (torch only where it runs), so that a conversion's process is a conversion's, as a user's would be."""
    from tasks.contracts.image_directory import ImageDirectory

    source, converted = work / "source", work / "converted"
    base = rss_mb()
    started = time.perf_counter()
    held = None
    if stage == "plain":
        from bench.convert import plain_loop

        base, started = rss_mb(), time.perf_counter()
        count = plain_loop(source, work / "plain", "*.png")
        shutil.rmtree(work / "plain")
    elif stage == "convert":
        from tasks.convert.conversion import convert_to_image_directory

        base, started = rss_mb(), time.perf_counter()
        count = len(convert_to_image_directory(source, converted))
    elif stage == "split":
        from tasks.data.split import split_image_directory

        base, started = rss_mb(), time.perf_counter()
        first, second = split_image_directory(converted, work / "train", work / "validation", 0.8)
        count = len(first) + len(second)
    elif stage == "validate":
        from tasks.data.validate import check_training_data

        base, started = rss_mb(), time.perf_counter()
        report = check_training_data(ImageDirectory(work / "train"), ImageDirectory(work / "validation"))
        count = sum(report.train_counts.values()) + sum(report.validation_counts.values())
    elif stage in ("index", "imagefolder"):
        import torch
        from torch.utils.data import DistributedSampler
        from torchvision.datasets import ImageFolder

        from tasks.contracts.transformations import ImageTransformations
        from tasks.vision.images import ImageFiles
        from tasks.vision.transforms import eval_transform

        torch.set_num_threads(os.cpu_count() or 1)
        base, started = rss_mb(), time.perf_counter()
        if stage == "index":
            # As the worker holds it: the datasets built from the manifest, the manifest let go.
            transform = eval_transform(ImageTransformations(), SIDE, (0.5,) * 3, (0.25,) * 3)
            dataset = ImageFiles(ImageDirectory(converted).samples(), transform)
        else:
            dataset = ImageFolder(str(converted))
        sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=1)
        order = list(iter(sampler))
        count = len(dataset)
        seconds = time.perf_counter() - started
        # An epoch looks up each of the rank's images once (path and label; decoding is not the index's cost):
        # the pages of a memory-mapped index it touches count as resident from here on.
        for i in order:
            dataset.samples[i]
        held = rss_mb() - base
        del order, sampler, dataset
    elif stage == "score":
        import torch

        from tasks.contracts.model_directory import ModelDirectory
        from tasks.contracts.scores_table import write_score_chunks
        from tasks.evaluation.score import score_chunks

        torch.set_num_threads(os.cpu_count() or 1)
        base, started = rss_mb(), time.perf_counter()
        chunks = score_chunks(ModelDirectory(work.parent / "model"), ImageDirectory(converted))
        count = write_score_chunks(chunks, str(work / "scores.csv")).rows  # as the stage writes it
    else:
        raise ValueError(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")
    if stage not in ("index", "imagefolder"):
        seconds = time.perf_counter() - started
    peak = peak_rss_mb()
    return {
        "stage": stage,
        "images": count,
        "seconds": seconds,
        "peak_mb": peak - base,
        "held_mb": held,
        "rss_mb": peak,
    }


def train_small_model(root: Path) -> None:
    """A ModelDirectory (shufflenet_v2_x0_5 at 16 px, one epoch on 1,000 images) for the score stage."""
    from tasks.contracts.model_directory import ModelSpec
    from tasks.contracts.training_config import TrainingFolders, TrainingParams
    from tasks.convert.conversion import convert_to_image_directory
    from tasks.data.split import split_image_directory
    from tasks.launch.torchrun_launcher import launch_training
    from tasks.model.untrained import write_untrained_model_directory

    write_images(root / "source", 1000)
    converted = convert_to_image_directory(root / "source", root / "converted")
    train, validation = split_image_directory(converted, root / "train", root / "validation", 0.8)
    spec = write_untrained_model_directory(
        root / "spec", ModelSpec(architecture="shufflenet_v2_x0_5", pretrained=False)
    )
    params = TrainingParams(epochs=1, batch_size=64, processes_per_node=1, device="cpu", image_size=SIDE)
    folders = TrainingFolders(str(train.root), str(validation.root), str(spec), str(root.parent / "model"))
    launch_training(folders, params, log=lambda level, line: None)


# --- the whole measurement ----------------------------------------------------------------------------------


def measure(sizes: list[int], workdir: Path) -> dict[int, dict[str, dict]]:
    train_small_model(workdir / "model-data")
    results: dict[int, dict[str, dict]] = {}
    for n in sizes:
        work = workdir / f"n{n}"
        started = time.monotonic()
        write_images(work / "source", n)
        print(f"[N = {n:,}: images written in {time.monotonic() - started:.0f} s]", flush=True)
        results[n] = {}
        for stage in STAGES:
            line = in_fresh_process("bench.scale", "--stage", stage, "--work", str(work))
            results[n][stage] = json.loads(line)
            r = results[n][stage]
            print(f"  {stage:<12} {r['seconds']:8.1f} s  peak +{r['peak_mb']:7.1f} MB", flush=True)
        shutil.rmtree(work)
    return results


def slope_kb(results: dict[int, dict[str, dict]], stage: str, key: str) -> tuple[float, float]:
    """Memory per image (KB) between the smallest and largest N, and the line's value at ImageNet's size (MB)."""
    small, large = min(results), max(results)
    a, b = results[small][stage][key], results[large][stage][key]
    per_image_mb = (b - a) / (large - small)
    return per_image_mb * 1024, a + per_image_mb * (IMAGENET - small)


def report(results: dict[int, dict[str, dict]]) -> tuple[str, list[Figure]]:
    sizes = sorted(results)
    rows = [("stage", *[f"N = {n:,}" for n in sizes], "memory slope", f"at {IMAGENET:,}")]
    for stage in STAGES:
        cells = []
        for n in sizes:
            r = results[n][stage]
            held = f", holds {r['held_mb']:.0f} MB" if r["held_mb"] is not None else ""
            process = f" (process {r['rss_mb']:,.0f} MB)" if stage == "convert" else ""
            cells.append(f"{r['seconds'] / n * 1e6:,.0f} us/img, peak +{r['peak_mb']:,.0f} MB{process}{held}")
        key = "held_mb" if results[sizes[0]][stage]["held_mb"] is not None else "peak_mb"
        per_image, at_imagenet = slope_kb(results, stage, key) if len(sizes) > 1 else (float("nan"),) * 2
        time_at_imagenet = results[sizes[-1]][stage]["seconds"] / sizes[-1] * IMAGENET
        rows.append(
            (stage, *cells, f"{per_image:.2f} KB/img", f"{at_imagenet:,.0f} MB, {time_at_imagenet / 60:,.0f} min")
        )
    text = aligned(rows)

    small, large = sizes[0], sizes[-1]
    at = results[large]
    figures = [
        Figure(
            f"scale: conversion time per image, N = {large:,}",
            at["convert"]["seconds"] / large * 1e6,
            at["plain"]["seconds"] / large * 1e6,
            "us/image",
            "<= 2x the plain PIL loop",
            goal=2.0,
            higher_is_better=False,
        ),
        Figure(
            f"scale: conversion process's peak RSS, N = {large:,} over N = {small:,}",
            at["convert"]["rss_mb"] / results[small]["convert"]["rss_mb"],
            None,
            "x",
            "<= 1.2x (flat in N)",
            goal=1.2,
            higher_is_better=False,
        ),
        Figure(
            f"scale: training index memory per rank, N = {large:,}",
            at["index"]["held_mb"],
            at["imagefolder"]["held_mb"],
            "MB",
            "<= 1.5x ImageFolder's",
            goal=1.5,
            higher_is_better=False,
        ),
        Figure(
            f"scale: index load per rank, N = {large:,}",
            at["index"]["seconds"],
            None,
            "s",
            "< 1 s",
            goal=1.0,
            higher_is_better=False,
        ),
    ]
    return text, figures


def figures(sizes: list[int] | None = None) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir:
        results = measure(sizes or DEFAULT_SIZES, Path(workdir))
    text, found = report(results)
    print(text)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="numbers of images")
    parser.add_argument("--imagenet", action="store_true", help=f"also N = {IMAGENET:,} (about 5 GB of disk)")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        print(json.dumps(run_stage(args.stage, args.work)))
        return
    sizes = sorted(set(args.sizes + ([IMAGENET] if args.imagenet else [])))
    print(table(figures(sizes)))


if __name__ == "__main__":
    main()
