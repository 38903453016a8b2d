"""ModelSpec → UntrainedModelDirectory for the training stage (Azure's DenseNet / ResNet model modules), with its
pretrained weights checked and staged beside the spec."""

from __future__ import annotations

import os
from pathlib import Path

from tasks.contracts.model_directory import (
    STAGED_WEIGHTS_FILE,
    WARM_START_FILE,
    ModelSpec,
    PretrainedWeights,
    write_model_spec,
)
from tasks.storage.local_files import copy_atomic


def with_pretrained_default(spec: ModelSpec, own_data: bool, warm_start: bool = False) -> ModelSpec:
    """``pretrained`` left empty means ImageNet weights for the user's own images (or a weights_path given) and
    none for the bundled digits, so that a first run on them needs no network; none either for a warm start, which
    begins from a registered version's weights (tasks/model/warm_start.py)."""
    if spec.pretrained is not None:
        return spec
    return spec.model_copy(update={"pretrained": not warm_start and (own_data or spec.weights_path is not None)})


def write_untrained_model_directory(
    output: str | os.PathLike[str], spec: ModelSpec, started_from: PretrainedWeights | None = None
) -> Path:
    """Write ``spec`` to ``output/model_spec.json``. With pretrained weights: resolve them (``tasks.vision.weights``:
    cache, mirror or URL, hash checked), check that they fit the architecture, copy the file into the directory
    (``pretrained_weights.pth``) and record its origin in the spec's ``weights``. ``started_from``: a warm start's
    weights, already staged in ``output`` (``tasks.model.warm_start.stage_warm_start``), recorded in the spec.

    Checking here, not in the worker, fails a bad weights file before any training job is launched; staging here,
    the file travels with the run, so training nodes never download.
    """
    output = Path(output)
    if started_from is None:
        (output / WARM_START_FILE).unlink(missing_ok=True)
    spec = spec.model_copy(update={"started_from": started_from})
    if not spec.pretrained:
        (output / STAGED_WEIGHTS_FILE).unlink(missing_ok=True)
        return write_model_spec(output, spec.model_copy(update={"weights": None}))
    from tasks.vision.networks import build_network
    from tasks.vision.weights import resolve_weights

    resolved = resolve_weights(spec)
    build_network(spec, num_classes=2, weights_file=resolved.path)
    copy_atomic(resolved.path, output / STAGED_WEIGHTS_FILE)
    return write_model_spec(output, spec.model_copy(update={"weights": resolved.origin}))
