"""The bundled default data set: scikit-learn's handwritten digits as a folder of PNG files.

python -m tasks.data.datasets data/digits      # writes data/digits/{train,validation}/<digit>/*.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image

from tasks.data.split import check_fraction
from tasks.errors import InvalidDatasetError
from tasks.storage.local_files import staged_directory

DIGITS_SPLITS = ("train", "validation")
_DONE_FILE = "digits.json"


def export_digits(output: str | Path, validation_fraction: float = 0.2, seed: int = 1) -> tuple[Path, Path]:
    """Write the 1,797 8x8 digits as PNGs, split train/validation stratified by class with ``seed``.

    Returns the (train, validation) folders. An existing export with the same split is reused.
    """
    output = Path(output)
    settings = {"validation_fraction": validation_fraction, "seed": seed, "source": "sklearn.datasets.load_digits"}
    done = output / _DONE_FILE
    if done.is_file() and json.loads(done.read_text()) == settings:
        return output / "train", output / "validation"
    if output.exists() and any(output.iterdir()) and not done.is_file():
        raise FileExistsError(f"{output} exists and is not a digits export: choose an empty or new folder")

    from sklearn.datasets import load_digits  # here: every flow imports this module, few export the digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    # Pixel values are 0..16; stretch them to 0..255 for 8-bit grayscale files.
    pixels = np.rint(digits.images * (255 / 16)).astype(np.uint8)
    indices = np.arange(len(digits.target))
    train_idx, val_idx = train_test_split(
        indices, test_size=validation_fraction, stratify=digits.target, random_state=seed
    )
    with staged_directory(output) as staging:
        for split, split_idx in zip(DIGITS_SPLITS, (train_idx, val_idx)):
            for i in sorted(split_idx):
                folder = staging / split / str(digits.target[i])
                folder.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels[i], mode="L").save(folder / f"digit_{i:04d}.png")
        (staging / _DONE_FILE).write_text(json.dumps(settings, indent=2))
    return output / "train", output / "validation"


def given_or_default_sources(
    train: str | None, validation: str | None, default_root: str | Path, validation_fraction: float | None = None
) -> tuple[str, str | None]:
    """The user's (train, validation) sources, or the digits export under ``default_root`` when neither is given.

    Validation is None when ``train`` alone is given with a ``validation_fraction``: the caller splits it.
    """
    if validation_fraction is not None:
        check_fraction(validation_fraction, "validation_fraction")
        if validation is not None:
            raise InvalidDatasetError(
                f"give validation_data or validation_fraction, not both: got validation_data={validation!r}, "
                f"validation_fraction={validation_fraction!r}"
            )
    if train is None and validation is None:
        share = {} if validation_fraction is None else {"validation_fraction": validation_fraction}
        train_dir, validation_dir = export_digits(Path(default_root) / "digits", **share)
        return str(train_dir), str(validation_dir)
    if train is None:
        raise InvalidDatasetError(
            f"validation_data={validation!r} was given without train_data: give train_data too "
            "(or neither, to use the bundled digits)"
        )
    if validation is None and validation_fraction is None:
        raise InvalidDatasetError(
            f"train_data={train!r} was given without validation images: give validation_data, or validation_fraction "
            "(e.g. 0.2) to split train_data into training and validation images"
        )
    return train, validation


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Export scikit-learn's digits as a class-per-folder PNG data set.")
    parser.add_argument("output", nargs="?", default="data/digits")
    parser.add_argument("--validation-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    for folder in export_digits(options.output, options.validation_fraction, options.seed):
        print(folder)
