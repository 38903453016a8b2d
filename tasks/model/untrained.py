"""ModelSpec → UntrainedModelDirectory for the training stage (Azure's DenseNet / ResNet model modules), with its
pretrained weights checked and staged beside the spec."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tasks.contracts.model_directory import (
    STAGED_WEIGHTS_FILE,
    ModelSpec,
    write_model_spec,
)
from tasks.storage.local_files import atomic_write


def with_pretrained_default(spec: ModelSpec, own_data: bool) -> ModelSpec:
    """``pretrained`` left empty means ImageNet weights for the user's own images (or a weights_path given) and
    none for the bundled digits, so that a first run on them needs no network."""
    if spec.pretrained is not None:
        return spec
    return spec.model_copy(update={"pretrained": own_data or spec.weights_path is not None})


def write_untrained_model_directory(output: str | os.PathLike[str], spec: ModelSpec) -> Path:
    """Write ``spec`` to ``output/model_spec.json``. With pretrained weights: resolve them (``tasks.vision.weights``:
    cache, mirror or URL, hash checked), check that they fit the architecture, copy the file into the directory
    (``pretrained_weights.pth``) and record its origin in the spec's ``weights``.

    Checking here, not in the worker, fails a bad weights file before any training job is launched; staging here,
    the file travels with the run, so training nodes never download.
    """
    output = Path(output)
    if not spec.pretrained:
        (output / STAGED_WEIGHTS_FILE).unlink(missing_ok=True)
        return write_model_spec(output, spec.model_copy(update={"weights": None}))
    from tasks.vision.networks import build_network
    from tasks.vision.weights import resolve_weights

    resolved = resolve_weights(spec)
    build_network(spec, num_classes=2, weights_file=resolved.path)
    output.mkdir(parents=True, exist_ok=True)
    with open(resolved.path, "rb") as source, atomic_write(output / STAGED_WEIGHTS_FILE, "wb") as staged:
        shutil.copyfileobj(source, staged)
    return write_model_spec(output, spec.model_copy(update={"weights": resolved.origin}))
