"""Batched scoring (tasks.score.score_images) against a naive loop: open each image with PIL, transform it,
run the model on a batch of one. Both run in one process on the same images and model, in alternating
repetitions; the medians and their ratio are printed.

    python -m bench.score                                   # digits validation, ResNet-18 at 32 px
    python -m bench.score --image-size 224 --limit 128      # torchvision's usual input size
    python -m bench.score --model digits-resnet18@production --images runs/<run>/data/validation
    python -m bench.score --runtime onnx                    # the batched side through onnxruntime

Without ``--model`` the network has random weights: throughput does not depend on what it learned.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

from tasks.convert import convert_to_image_directory
from tasks.datasets import export_digits
from tasks.image_directory import ImageDirectory
from tasks.model_directory import (
    CLASSES_FILE,
    ONNX_FILE,
    SPEC_FILE,
    WEIGHTS_FILE,
    ModelDirectory,
    ModelSpec,
    TrainedModelSpec,
)
from tasks.onnx_export import export_onnx
from tasks.registry import load_model
from tasks.score import score_images
from tasks.training.data import choose_image_size, eval_transform
from tasks.training.models import build_model, load_trained_model


def random_model_directory(root: Path, architecture: str, classes: list[str], image_size: int) -> ModelDirectory:
    spec = TrainedModelSpec(**ModelSpec(architecture=architecture).model_dump(), num_classes=len(classes), image_size=image_size)
    root.mkdir(parents=True, exist_ok=True)
    torch.save(build_model(spec, len(classes)).state_dict(), root / WEIGHTS_FILE)
    (root / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
    (root / CLASSES_FILE).write_text(json.dumps(classes))
    return ModelDirectory(root)


def naive_scores(model_dir: ModelDirectory, images: ImageDirectory) -> list[list[float]]:
    """What a first script does: one image at a time, straight from PIL to the model."""
    spec = model_dir.spec
    model = load_trained_model(model_dir, "cpu")
    transform = eval_transform(spec.image_size, spec.mean, spec.std)
    rows = []
    with torch.no_grad():
        for path, _ in images.samples():
            with Image.open(path) as image:
                tensor = transform(image.convert("RGB")).unsqueeze(0)
            rows.append(torch.softmax(model(tensor), dim=1)[0].tolist())
    return rows


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(prog="python -m bench.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="ModelDirectory or registry reference (default: random-weight --architecture)")
    parser.add_argument("--registry", default="registry", help="where --model references resolve")
    parser.add_argument("--images", help="an ImageDirectory (default: the digits validation split)")
    parser.add_argument("--architecture", default="resnet18")
    parser.add_argument("--image-size", type=int, help="input side for the random-weight model (default: from the images)")
    parser.add_argument("--limit", type=int, default=0, help="score only the first N images (0: all)")
    parser.add_argument("--runtime", choices=("torch", "onnx"), default="torch", help="runtime of the batched side")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-score-") as scratch:
        scratch = Path(scratch)
        if args.images:
            images = ImageDirectory(args.images)
        else:
            images = convert_to_image_directory(export_digits(scratch / "digits")[1], scratch / "images")
        if args.limit:
            images.manifest.images = images.manifest.images[: args.limit]
        if args.model:
            model_dir = load_model(args.model, args.registry, scratch / "models")
        else:
            size = args.image_size or choose_image_size(images.median_side())
            model_dir = random_model_directory(scratch / "model", args.architecture, images.classes or ["a", "b"], size)
        if args.runtime == "onnx" and not (model_dir.root / ONNX_FILE).is_file():
            # Exported into a copy: a registered version is never modified.
            model_dir = export_onnx(ModelDirectory(shutil.copytree(model_dir.root, scratch / "onnx-model")))

        naive_scores(model_dir, images)  # warm-up: first-call allocations and file cache
        score_images(model_dir, images, runtime=args.runtime)
        naive, batched = [], []
        for _ in range(args.repetitions):
            started = time.perf_counter()
            naive_scores(model_dir, images)
            naive.append(len(images) / (time.perf_counter() - started))
            started = time.perf_counter()
            score_images(model_dir, images, runtime=args.runtime)
            batched.append(len(images) / (time.perf_counter() - started))

    ratio = statistics.median(batched) / statistics.median(naive)
    spec = model_dir.spec
    print(f"{len(images)} images, {spec.architecture} at {spec.image_size} px, {torch.get_num_threads()} CPU threads, "
          f"{args.repetitions} alternating repetitions (median)")  # fmt: skip
    print(f"  naive per-image PIL + model loop : {statistics.median(naive):8.1f} images/s")
    print(f"  batched score_images ({args.runtime:5s})    : {statistics.median(batched):8.1f} images/s")
    print(f"  ratio                            : {ratio:8.2f}x")
    return ratio


if __name__ == "__main__":
    main()
