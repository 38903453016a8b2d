"""Label validation: refuse training data a classifier cannot be trained on, before anything launches."""

from __future__ import annotations

from pydantic import BaseModel

from tasks.errors import InvalidDatasetError, NotLabeledDatasetError
from tasks.image_directory import ImageDirectory


class LabelReport(BaseModel):
    classes: list[str]
    train_counts: dict[str, int]
    validation_counts: dict[str, int]
    quarantined: int

    @property
    def imbalance_ratio(self) -> float:
        """Largest over smallest training class."""
        return max(self.train_counts.values()) / min(self.train_counts.values())


def check_training_data(train: ImageDirectory, validation: ImageDirectory) -> LabelReport:
    """Both sets labeled, with the same classes (at least two). Raises the typed errors otherwise."""
    for role, data in (("training", train), ("validation", validation)):
        if not data.labeled:
            raise NotLabeledDatasetError(
                f"the {role} data at {data.root} is not labeled: put each class's images in a folder "
                f"named after the class (e.g. {data.root.name}/cat/1.jpg, {data.root.name}/dog/2.jpg)"
            )
    train_classes, val_classes = set(train.classes), set(validation.classes)
    if train_classes != val_classes:
        only_train = sorted(train_classes - val_classes)
        only_val = sorted(val_classes - train_classes)
        raise InvalidDatasetError(
            "training and validation classes differ: "
            f"only in training {only_train or 'none'}, only in validation {only_val or 'none'}: "
            "add the missing classes' images, or remove the extra classes, so both sets have the same classes"
        )
    if len(train_classes) < 2:
        raise InvalidDatasetError(
            f"the training data at {train.root} has {len(train_classes)} class {sorted(train_classes)}: "
            "a classifier needs at least two class folders"
        )
    return LabelReport(
        classes=train.classes,
        train_counts=dict(train.manifest.counts),
        validation_counts=dict(validation.manifest.counts),
        quarantined=len(train.manifest.quarantined) + len(validation.manifest.quarantined),
    )


# --- Prefect task -------------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.artifacts import create_table_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402


@task(name="validate-labels", cache_policy=NO_CACHE)
def validate_labels(train: str, validation: str) -> LabelReport:
    """Deterministic: never retried. Artifact ``label-validation``: images per class in each set."""
    report = check_training_data(ImageDirectory(train), ImageDirectory(validation))
    create_table_artifact(
        key="label-validation",
        table=[
            {"class": c, "train": report.train_counts[c], "validation": report.validation_counts[c]}
            for c in report.classes
        ],
        description=f"{len(report.classes)} classes; imbalance (largest/smallest training class) "
        f"{report.imbalance_ratio:.2f}; {report.quarantined} files quarantined",
    )
    get_run_logger().info("labels valid: %d classes, imbalance ratio %.2f", len(report.classes), report.imbalance_ratio)
    return report
