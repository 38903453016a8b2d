"""Class weighting on an imbalanced set: the bundled digits with one class cut to a tenth of the others, trained by
the real worker with ``class_weighting`` none and balanced (same seed, data and settings otherwise), each scored
and evaluated on the full validation split. Prints macro-F1 and the small class's recall side by side. Accuracy,
not speed: nothing is asserted.

    python -m bench.imbalance                   # digit 3 at 10% of its training images, 5 epochs, ResNet-18
    python -m bench.imbalance --small-class 8 --share 0.05 --epochs 8
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from bench.harness import Figure, table
from tasks.contracts.image_directory import ImageDirectory
from tasks.contracts.model_directory import ModelSpec
from tasks.contracts.training_config import TrainingFolders, TrainingParams
from tasks.convert.conversion import convert_to_image_directory
from tasks.data.datasets import export_digits
from tasks.evaluation.evaluate import evaluate_scores
from tasks.evaluation.score import score_images
from tasks.launch.torchrun_launcher import launch_training
from tasks.model.untrained import write_untrained_model_directory


def imbalanced_copy(train: Path, output: Path, small_class: str, share: float) -> Path:
    """``train`` (class folders) with ``small_class`` cut to ``share`` of its images (the first ones by name)."""
    shutil.copytree(train, output)
    images = sorted((output / small_class).iterdir())
    for image in images[max(1, round(len(images) * share)) :]:
        image.unlink()
    return output


def figures(small_class: str = "3", share: float = 0.1, epochs: int = 5) -> list[Figure]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-imbalance-") as scratch:
        scratch = Path(scratch)
        train, validation = export_digits(scratch / "digits")
        small = imbalanced_copy(train, scratch / "imbalanced", small_class, share)
        train_dir = convert_to_image_directory(small, scratch / "train").root
        val_dir = convert_to_image_directory(validation, scratch / "validation").root
        spec = write_untrained_model_directory(scratch / "spec", ModelSpec(architecture="resnet18", pretrained=False))
        counts = ImageDirectory(train_dir).manifest.counts
        for weighting in ("none", "balanced"):
            params = TrainingParams(epochs=epochs, learning_rate=0.004, class_weighting=weighting)
            output = scratch / f"model-{weighting}"
            model_dir = launch_training(
                TrainingFolders(train_dir, val_dir, spec, output), params, log=lambda level, line: None
            )
            evaluation = evaluate_scores(score_images(model_dir, ImageDirectory(val_dir)))
            recall = next(c.recall for c in evaluation.per_class if c.name == small_class)
            results[weighting] = (evaluation.f1_macro, recall)
            print(
                f"class_weighting {weighting}: F1 (macro) {evaluation.f1_macro:.4f}, recall of {small_class} {recall:.4f}"
            )
    setting = (
        f"digits, class {small_class} at {counts[small_class]} training images against "
        f"{min(v for k, v in counts.items() if k != small_class)}-{max(counts.values())} for the others; ResNet-18 "
        f"from scratch, {epochs} epochs, 1 process, seed 1; the full validation split"
    )
    return [
        Figure(
            "F1 (macro): balanced vs none", results["balanced"][0], results["none"][0], "", "measured", notes=setting
        ),
        Figure(
            f"recall of the small class {small_class}: balanced vs none",
            results["balanced"][1],
            results["none"][1],
            "",
            "measured",
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small-class", default="3")
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    print(table(figures(args.small_class, args.share, args.epochs)))
