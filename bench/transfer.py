"""Transfer learning, honestly on this machine: fine-tuned "pretrained" weights against training from scratch.

    python -m bench.transfer                     # 10 and 30 images per class, 10 epochs, seed 1 (about 6 minutes)
    python -m bench.transfer --per-class 10 --epochs 5

ImageNet weights cannot be downloaded here, so the pretrained weights are made the same way, on a smaller scale:
ResNet-18 is trained from scratch on the digits 0-4, its state dict is saved in torchvision's layout and served by
a loopback HTTP server. The product then fetches it as it fetches any weights (``weights_path`` as an http URL with
its sha256: downloaded, hash-checked, staged with the run) to fine-tune on the digits 5-9, which it has never seen,
from 10 and 30 training images per class. Three runs per size, with the same epochs, seed and validation images
(every validation image of the digits 5-9):

- scratch: random initial weights (``pretrained=False``);
- fine-tune all: the pretrained weights, every layer trained (``fine_tuning="all"``);
- head only: the pretrained weights as a fixed feature extractor, only the new head trained (``fine_tuning="head"``).

Each run is the plain stages the pipeline runs (convert, model spec, the torchrun worker), not a Prefect flow:
the figure is accuracy, and the flow would only add its start-up time.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
import torchvision

from bench.harness import Figure, table
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.datasets import export_digits
from tasks.launch.torchrun_launcher import launch_training
from tasks.model.untrained import write_untrained_model_directory

PRETRAIN_CLASSES = ("0", "1", "2", "3", "4")
FINE_TUNE_CLASSES = ("5", "6", "7", "8", "9")
MODES = ("scratch", "fine-tune all", "head only")


def copy_classes(source: Path, destination: Path, classes: tuple[str, ...], per_class: int | None = None) -> Path:
    """A class-per-folder copy of ``classes`` from ``source``: every image, or the first ``per_class`` by name."""
    for name in classes:
        (destination / name).mkdir(parents=True)
        for image in sorted((source / name).iterdir())[:per_class]:
            shutil.copy2(image, destination / name / image.name)
    return destination


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[str]:
    """A loopback HTTP server for ``folder``, standing in for a weights mirror; yields its base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass


def train(train_root: Path, validation_root: Path, spec: ModelSpec, params: TrainingParams, out: Path) -> float:
    """Best validation top-1 of one training run through the real stages."""
    train_dir = convert_to_image_directory(train_root, out / "data" / "train")
    validation_dir = convert_to_image_directory(validation_root, out / "data" / "validation")
    spec_dir = write_untrained_model_directory(out / "model_spec", spec)
    folders = TrainingFolders(train_dir.root, validation_dir.root, spec_dir, out / "model")
    model_dir = launch_training(folders, params, log=lambda level, line: None)
    return model_dir.metrics().best_top1


def pretrained_weights(scratch: Path, digits_train: Path, digits_validation: Path, epochs: int) -> Path:
    """ResNet-18 trained on the digits 0-4, saved as torchvision's resnet18 state dict (its 1,000-class head
    untouched: the product replaces the head after loading, so only the backbone carries over)."""
    out = scratch / "pretrain"
    top1 = train(
        copy_classes(digits_train, out / "source" / "train", PRETRAIN_CLASSES),
        copy_classes(digits_validation, out / "source" / "validation", PRETRAIN_CLASSES),
        ModelSpec(architecture="resnet18", pretrained=False),
        TrainingParams(epochs=epochs, patience=epochs, device="cpu"),
        out,
    )
    print(f"pretrained on the digits 0-4: top-1 {top1:.4f}", flush=True)
    trained = torch.load(out / "model" / "model.pt", weights_only=True)
    state = torchvision.models.resnet18().state_dict()
    state.update({key: value for key, value in trained.items() if not key.startswith("fc.")})
    mirror = scratch / "mirror"
    mirror.mkdir()
    torch.save(state, mirror / "weights.pth")
    digest = hashlib.sha256((mirror / "weights.pth").read_bytes()).hexdigest()
    return (mirror / "weights.pth").rename(mirror / f"resnet18-digits04-{digest[:8]}.pth")


def results(per_class: list[int], epochs: int, pretrain_epochs: int, seed: int) -> dict[tuple[int, str], float]:
    top1: dict[tuple[int, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-transfer-") as scratch_name:
        scratch = Path(scratch_name)
        # The fetched weights are cached in torch's cache like any others: this run's own, not the user's.
        os.environ["TORCH_HOME"] = str(scratch / "torch")
        digits_train, digits_validation = export_digits(scratch / "digits")
        weights = pretrained_weights(scratch, digits_train, digits_validation, pretrain_epochs)
        sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()
        validation = copy_classes(digits_validation, scratch / "validation-5-9", FINE_TUNE_CLASSES)
        with serving(weights.parent) as mirror:
            pretrained = ModelSpec(
                architecture="resnet18", pretrained=True, weights_path=f"{mirror}/{weights.name}", weights_sha256=sha256
            )
            for n in per_class:
                source = copy_classes(digits_train, scratch / f"train-5-9-{n}", FINE_TUNE_CLASSES, n)
                runs = {
                    "scratch": (ModelSpec(architecture="resnet18", pretrained=False), "all"),
                    "fine-tune all": (pretrained, "all"),
                    "head only": (pretrained, "head"),
                }
                for mode, (spec, fine_tuning) in runs.items():
                    params = TrainingParams(
                        epochs=epochs, patience=epochs, random_seed=seed, fine_tuning=fine_tuning, device="cpu"
                    )
                    out = scratch / f"{n}-{mode.replace(' ', '-')}"
                    top1[n, mode] = train(source, validation, spec, params, out)
                    print(f"{n} images/class, {mode}: top-1 {top1[n, mode]:.4f}", flush=True)
        images = len(ImageDirectory(scratch / f"{per_class[0]}-scratch" / "data" / "validation"))
        print(f"validation: {images} images of the digits 5-9", flush=True)
    return top1


def figures(
    per_class: tuple[int, ...] = (10, 30), epochs: int = 10, pretrain_epochs: int = 5, seed: int = 1
) -> list[Figure]:
    top1 = results(list(per_class), epochs, pretrain_epochs, seed)
    notes = f"ResNet-18 at 32 px, digits 5-9, {epochs} epochs, seed {seed}; weights pretrained on the digits 0-4"
    return [
        Figure(
            f"top-1, {mode} vs scratch, {n} images/class",
            100 * top1[n, mode],
            100 * top1[n, "scratch"],
            "%",
            "> 1x (better than scratch)",
            1.0,
            notes=notes,
        )
        for n in per_class
        for mode in MODES[1:]
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-class", type=int, nargs="+", default=[10, 30], help="training images per class")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of each fine-tuning run")
    parser.add_argument("--pretrain-epochs", type=int, default=5, help="epochs of the digits 0-4 pretraining")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    print(table(figures(tuple(options.per_class), options.epochs, options.pretrain_epochs, options.seed)))
