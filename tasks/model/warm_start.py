"""A warm start: a training that begins from a registered version's weights, its head included, instead of ImageNet's
or random ones: how a served model is retrained on what it got wrong (a labelled batch, docs/monitoring.md) without
forgetting what it knew. The version must fit the run: the same architecture, and the same classes in the same
order (the head keeps one output per class).

The model stage fetches the version (``fetch_model``: every file checked against its registered sha256), checks it,
and stages its ``model.pt`` in the UntrainedModelDirectory as ``warm_start.pt`` with its origin recorded in the
spec's ``started_from``; training nodes load that copy (``tasks.vision.weights.staged_warm_start``, its hash checked
again) into the network once the head is built, and never read the registry. The trained version's spec keeps ``started_from``, so
its model card says where it began.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tasks.contracts.model_directory import WARM_START_FILE, PretrainedWeights
from tasks.errors import WarmStartMismatchError
from tasks.storage.local_files import copy_atomic, sha256_file


def check_warm_start(reference: str, registry: str, pretrained: bool | None) -> None:
    """Before any work: the version exists (``ModelNotFoundError`` names what does), and ImageNet weights are not
    asked for as well."""
    from tasks.registry import resolve

    if pretrained:
        raise WarmStartMismatchError(
            f"pretrained is true and warm_start is {reference}: a warm start begins from that version's weights; "
            "set pretrained to false (or leave it empty), or leave warm_start empty"
        )
    resolve(registry, reference)


def check_fits(reference: str, architecture: str, classes: list[str], started: str, started_classes: list[str]) -> None:
    """``WarmStartMismatchError`` unless the version ``reference`` (a ``started`` network knowing
    ``started_classes``) fits a run training ``architecture`` on ``classes``."""
    if started != architecture:
        raise WarmStartMismatchError(
            f"warm_start {reference} is a {started}, but this run trains a {architecture}: set the architecture to "
            f"{started}, or leave warm_start empty to train from other weights"
        )
    if list(started_classes) != list(classes):
        missing = sorted(set(started_classes) - set(classes))
        new = sorted(set(classes) - set(started_classes))
        found = (
            f"it lacks {new} and the data lacks {missing}"
            if new or missing
            else f"in another order ({started_classes} against {classes})"
        )
        raise WarmStartMismatchError(
            f"warm_start {reference} knows other classes than the training data: {found}. The head keeps one output "
            "per class: train it on the same classes, or leave warm_start empty"
        )


def stage_warm_start(
    output: str | os.PathLike[str], registry: str, reference: str, architecture: str, classes: list[str]
) -> PretrainedWeights:
    """The version ``reference`` in ``registry`` fetched (checked against its registered hashes), checked to fit a
    run training ``architecture`` on ``classes``, and its weights copied to ``output/warm_start.pt``: their origin."""
    from tasks.registry import fetch_model, resolve

    registration = resolve(registry, reference)
    exact = f"{registration.name}/{registration.version}"
    with tempfile.TemporaryDirectory(prefix="image-classifier-warm-start-") as cache:
        started = fetch_model(registry, exact, cache)
        check_fits(reference, architecture, classes, started.spec.architecture, started.classes)
        staged = copy_atomic(started.weights_path, Path(output) / WARM_START_FILE)
    name = exact if reference == exact else f"{exact} ({reference})"
    return PretrainedWeights(name=name, sha256=sha256_file(staged), source=str(registry))
