"""Fail fast: what can be checked of the data before any work starts is checked first, in seconds, with the
message the stage itself would give later (a missing folder, differing class folders, an image size the network
does not take, a missing weights file).

Cheap checks only: local paths are looked at (S3 prefixes and archives are left to their stage), a local folder's
class folders are listed (no image is opened). The flows call these first, and the command lines call them before
a flow run starts; the registry's names and references are tasks/registry/preflight.py's.
"""

from __future__ import annotations

from pathlib import Path

from tasks.errors import InvalidDatasetError, PretrainedWeightsError
from tasks.storage.s3 import existing_local_path, is_remote


def check_source(location: str, role: str) -> None:
    """A local source that does not exist is refused now (``role``: training, validation, scoring)."""
    existing_local_path(
        location, f"the {role} data", "give a class-per-folder folder, a .zip/.tar archive or an s3://bucket/prefix"
    )


def folder_classes(location: str) -> set[str] | None:
    """The class folders of a local folder of labeled images, as the convert stage will see them (None: not a
    local folder, or not labeled by class folders; its stage decides)."""
    from tasks.convert.labelling import plan_source
    from tasks.convert.listing import list_folder

    path = Path(location).expanduser()
    if is_remote(location) or not path.is_dir():
        return None
    try:
        plan, labels_file = plan_source(path, list_folder(path))
    except Exception:  # noqa: BLE001  (not knowable cheaply: the convert stage reports it properly)
        return None
    if not plan.labeled or labels_file is not None:
        return None
    return set(plan.classes)


def check_training_sources(train: str | None, validation: str | None, validation_fraction: float | None) -> None:
    """The combination given, each local source exists, and two local class-folder sets have the same classes."""
    from tasks.data.datasets import given_or_default_sources
    from tasks.data.validate import differing_classes_message

    if train is None and validation is None:
        return  # the bundled digits
    given_or_default_sources(train, validation, "", validation_fraction)  # the combination (no digits export)
    check_source(train, "training")
    if validation is not None:
        check_source(validation, "validation")
        train_classes, validation_classes = folder_classes(train), folder_classes(validation)
        if train_classes is not None and validation_classes is not None and train_classes != validation_classes:
            raise InvalidDatasetError(differing_classes_message(train_classes, validation_classes))


def check_training_inputs(
    train: str | None,
    validation: str | None,
    validation_fraction: float | None,
    architecture: str,
    image_size: int | None,
    weights_path: str | None = None,
) -> None:
    """Everything about the data and the network the training pipeline can check before it converts an image (or
    fetches weights)."""
    from tasks.contracts.architectures import check_image_size

    check_image_size(architecture, image_size)
    check_training_sources(train, validation, validation_fraction)
    if weights_path and not is_remote(weights_path) and not Path(weights_path).expanduser().is_file():
        raise PretrainedWeightsError(
            f"weights_path {weights_path} for {architecture} does not exist (looked for "
            f"{Path(weights_path).expanduser().resolve()}): give a .pth file, an https:// URL or an s3:// URI"
        )
