"""How long ``image-classifier predict`` takes for one photo once Python has imported it: loading the model (a
ModelDirectory: spec, classes, weights) and labelling one 3,000 x 2,000 JPEG, as a phone takes it, on this
machine's CPU. The same in a loop of scoring's ``score_images`` would convert the photo first; this is the path
with no conversion and no server. Prints seconds (median of 5, after one warm-up); asserts nothing.

    python -m bench.predict                       # ResNet-18 with random weights, 10 classes
    python -m bench.predict --architecture resnet50
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bench.score import random_model_directory
from tasks.predict.classifier import Classifier


def seconds(architecture: str, repetitions: int = 5) -> tuple[float, float]:
    """(median seconds to load the model and label one photo, median seconds of the labelling alone)."""
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as scratch:
        scratch = Path(scratch)
        model_dir = random_model_directory(scratch / "model", architecture, [f"class{i}" for i in range(10)], 224)
        small = np.random.default_rng(0).integers(0, 256, (250, 375, 3), dtype=np.uint8)
        photo = scratch / "IMG_0001.jpg"
        Image.fromarray(small).resize((3000, 2000), Image.Resampling.BICUBIC).save(photo, quality=90)
        whole, alone = [], []
        for _ in range(repetitions + 1):
            started = time.perf_counter()
            classifier = Classifier.load(model_dir.root)
            loaded = time.perf_counter()
            classifier.predict(photo)
            done = time.perf_counter()
            whole.append(done - started)
            alone.append(done - loaded)
    return statistics.median(whole[1:]), statistics.median(alone[1:])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architecture", default="resnet18")
    args = parser.parse_args()
    total, labelling = seconds(args.architecture)
    print(
        f"predict, one 3000x2000 JPEG, {args.architecture} @224 on the CPU: {total:.2f} s after imports "
        f"(labelling alone {labelling:.2f} s; target <= 3 s)"
    )
