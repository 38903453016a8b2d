"""Batched scoring (tasks.evaluation.score.score_images) against a naive loop: open each image with PIL, transform it,
run the model on a batch of one. Both run on the same images and model, in alternating repetitions; the
medians and their ratio are printed. Asserts nothing.

    python -m bench.score                                   # digits validation: ResNet-18 at 32 px and at 224 px
    python -m bench.score --image-size 224 --limit-at-224 0 # all 360 images at torchvision's usual size
    python -m bench.score --model digits-resnet18@production --images runs/<run>/data/validation
    python -m bench.score --runtime onnx                    # the batched side through onnxruntime only

The naive loop runs in a fresh process each time (a first script's process: default allocator, no warm
state of ours); the batched side runs here.

Without ``--model`` the network has random weights: throughput does not depend on what it learned.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from PIL import Image

from bench.harness import Figure, alternate, in_fresh_process, table
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import (
    CLASSES_FILE,
    ONNX_FILE,
    SPEC_FILE,
    WEIGHTS_FILE,
    ModelDirectory,
    ModelSpec,
    TrainedModelSpec,
)
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.datasets import export_digits
from tasks.evaluation.onnx_export import export_onnx
from tasks.evaluation.score import BATCH_SIZE, score_images
from tasks.registry import load_model
from tasks.vision.images import choose_image_size
from tasks.vision.networks import build_network, load_trained_model
from tasks.vision.transforms import eval_transform


def random_model_directory(root: Path, architecture: str, classes: list[str], image_size: int) -> ModelDirectory:
    spec = TrainedModelSpec(
        **ModelSpec(architecture=architecture).model_dump(), num_classes=len(classes), image_size=image_size
    )
    root.mkdir(parents=True, exist_ok=True)
    torch.save(build_network(spec, len(classes)).state_dict(), root / WEIGHTS_FILE)
    (root / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
    (root / CLASSES_FILE).write_text(json.dumps(classes))
    return ModelDirectory(root)


def naive_scores(model_dir: ModelDirectory, images: ImageDirectory) -> list[list[float]]:
    """What a first script does: one image at a time, straight from PIL to the model."""
    spec = model_dir.spec
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU host a first script moves its model there
    model = load_trained_model(model_dir, device)
    transform = eval_transform(spec.transformations, spec.image_size, spec.mean, spec.std)
    rows = []
    with torch.no_grad():
        for path, _ in images.samples():
            with Image.open(path) as image:
                tensor = transform(image.convert("RGB")).unsqueeze(0).to(device)
            rows.append(torch.softmax(model(tensor), dim=1)[0].tolist())
    return rows


def naive_in_subprocess(model_dir: ModelDirectory, images: ImageDirectory) -> float:
    """images/s of the naive loop in a fresh process, as a first script runs: with the C library's default
    allocator (scoring sets this process's to keep freed memory: tasks/allocator.py) and none of our threads.
    One warm-up pass, then one timed pass, as on our side."""
    return float(
        in_fresh_process(
            "bench.score", "--naive", str(model_dir.root), "--images", str(images.root), "--limit", str(len(images))
        )
    )


def images_per_s(run: Callable[[], object], count: int) -> float:
    started = time.perf_counter()
    run()
    return count / (time.perf_counter() - started)


def measure(
    model_dir: ModelDirectory,
    images: ImageDirectory,
    runtime: str,
    repetitions: int,
    what: str,
    precision: str = "fp32",
    decode_on: str | None = None,
) -> Figure:
    """Batched against naive, alternating repetitions after one warm-up of ours (allocations, file cache)."""

    def ours() -> object:
        return score_images(model_dir, images, runtime=runtime, precision=precision, decode_on=decode_on)

    ours()
    medians = alternate(
        {
            "batched": lambda: images_per_s(ours, len(images)),
            "naive": lambda: naive_in_subprocess(model_dir, images),
        },
        repetitions,
    )
    spec = model_dir.spec
    print(f"{what}: ours {medians['batched']:.1f} images/s, naive {medians['naive']:.1f} images/s", flush=True)
    return Figure(
        what,
        medians["batched"],
        medians["naive"],
        "images/s",
        ">= 10x a per-image PIL + model loop on the GPU"
        if torch.cuda.is_available()
        else ">= 3x a per-image PIL + model loop",
        10.0 if torch.cuda.is_available() else 3.0,
        notes=f"{len(images)} images, {spec.architecture} at {spec.image_size} px, {runtime}, {precision} precision, decoded on {decode_on or 'the default'}, batch {BATCH_SIZE}, "
        f"{repetitions} alternating repetitions, {torch.get_num_threads()} CPU threads",
    )


def limited(image_dir: ImageDirectory, limit: int) -> ImageDirectory:
    """The same directory with only its first ``limit`` images (in memory: nothing on disk changes)."""
    return ImageDirectory(image_dir.root).head(limit)


def figures(
    model: str | None = None,
    images: str | None = None,
    registry: str = "registry",
    architecture: str = "resnet18",
    image_sizes: tuple[int, ...] = (0, 224),
    limit_at_224: int = 96,
    runtimes: tuple[str, ...] = ("torch",),
    repetitions: int = 5,
    onnx_at_224: bool = True,
    jpegs: int = 0,
    precisions: tuple[str, ...] = ("fp32",),
    decode_ons: tuple[str | None, ...] = (None,),
) -> list[Figure]:
    """One figure per image size (0: the images' own, rounded as training does), runtime and precision (torch
    only); one per runtime for a given ``model``. ``onnx_at_224`` adds onnxruntime at 224 px, the CPU's faster
    runtime there. ``jpegs``: score that many 256 px JPEG photographs' stand-ins instead of the digits' PNGs."""
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-score-") as scratch:
        scratch = Path(scratch)
        if jpegs:
            from bench.gpu import write_jpegs

            write_jpegs(scratch / "jpegs", jpegs, side=256)
            image_dir = convert_to_image_directory(scratch / "jpegs", scratch / "images")
        elif images:
            image_dir = ImageDirectory(images)
        else:
            image_dir = convert_to_image_directory(export_digits(scratch / "digits")[1], scratch / "images")
        if model:
            candidates = [load_model(model, registry, scratch / "models")]
        else:
            sizes = [size or choose_image_size(image_dir.median_side()) for size in image_sizes]
            classes = image_dir.classes or ["a", "b"]
            candidates = [random_model_directory(scratch / f"model-{s}", architecture, classes, s) for s in sizes]
        for model_dir in candidates:
            large = model_dir.spec.image_size >= 224
            for runtime in dict.fromkeys(runtimes + (("onnx",) if large and onnx_at_224 else ())):
                if runtime == "onnx" and not (model_dir.root / ONNX_FILE).is_file():
                    # Exported into a copy: a registered version is never modified.
                    copy = shutil.copytree(model_dir.root, scratch / f"onnx-{model_dir.root.name}")
                    model_dir = export_onnx(ModelDirectory(copy))
                # The naive loop manages a few images/s at 224 px on a small CPU: a subset keeps the run short.
                subset = limited(image_dir, limit_at_224) if large and limit_at_224 else image_dir
                kind = "JPEGs" if jpegs else "images"
                what = f"scoring {kind} at {model_dir.spec.image_size} px" + (" (onnx)" if runtime == "onnx" else "")
                torch_runtime = runtime == "torch"
                for precision in precisions if torch_runtime else ("fp32",):
                    for decode_on in decode_ons if torch_runtime else (None,):
                        named = what + (f", {precision}" if len(precisions) > 1 and torch_runtime else "")
                        named += f", decoded on {decode_on}" if len(decode_ons) > 1 and torch_runtime else ""
                        results.append(measure(model_dir, subset, runtime, repetitions, named, precision, decode_on))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="ModelDirectory or registry reference (default: random-weight --architecture)")
    parser.add_argument("--registry", default="registry", help="where --model references resolve")
    parser.add_argument("--images", help="an ImageDirectory (default: the digits validation split)")
    parser.add_argument("--architecture", default="resnet18")
    parser.add_argument(
        "--image-size",
        type=int,
        action="append",
        help="input side(s) of the random-weight model (default: the images' own and 224)",
    )
    parser.add_argument("--limit-at-224", type=int, default=96, help="images scored at 224 px and above (0: all)")
    parser.add_argument(
        "--runtime",
        choices=("torch", "onnx"),
        action="append",
        help="runtime(s) of the batched side (default: torch, and onnx at 224 px)",
    )
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--jpegs", type=int, default=0, help="score this many generated 256 px JPEGs (0: the digits)")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), action="append", help="torch's precision(s) (default: fp32)"
    )
    parser.add_argument(
        "--decode-on",
        choices=("cpu", "device"),
        action="append",
        help="where torch's side decodes (default: the device on CUDA, the CPU elsewhere)",
    )
    parser.add_argument("--naive", metavar="MODEL_DIR", help="only time the naive loop of MODEL_DIR on --images")
    parser.add_argument("--limit", type=int, help="with --naive: the first LIMIT images")
    args = parser.parse_args(argv)
    if args.naive:
        model_dir, image_dir = ModelDirectory(args.naive), limited(ImageDirectory(args.images), args.limit)
        naive_scores(model_dir, image_dir)
        print(images_per_s(lambda: naive_scores(model_dir, image_dir), len(image_dir)))
        return
    print(
        table(
            figures(
                args.model,
                args.images,
                args.registry,
                args.architecture,
                tuple(args.image_size or (0, 224)),
                args.limit_at_224,
                tuple(args.runtime or ("torch",)),
                args.repetitions,
                onnx_at_224=not args.runtime,
                jpegs=args.jpegs,
                precisions=tuple(args.precision or ("fp32",)),
                decode_ons=tuple(args.decode_on or (None,)),
            )
        )
    )


if __name__ == "__main__":
    main()
