"""The monitoring stage's Prefect tasks: the reference kept with a version the pipeline registers, and the monitor:
one look at the served version (tasks/monitoring/window.py), its report as the artifact ``model-drift`` with its
pictures, and, when a figure passes its threshold, the Prefect event ``image-classifier.model.drift`` about the
version (resource ``image-classifier.model.<name>.<version>``, the figures in its payload), which the retraining
automation (deployments/automations.py) turns into a training run; and a labelled batch added to a training's
images (artifact ``labelled-data``, the event ``image-classifier.data.labelled`` about the model's name)."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.events import emit_event
from prefect.runtime import flow_run

from tasks.monitoring.drift import ALPHA, MIN_RECORDS, DriftReport
from tasks.monitoring.events import DRIFT_EVENT, LABELLED_EVENT, model_name_resource, model_resource
from tasks.retrying import stage_task

ARTIFACT_KEY = "model-drift"
LABELLED_ARTIFACT_KEY = "labelled-data"


@stage_task(retries=0)
def keep_reference(model_dir: str, validation_dir: str) -> str:
    """``reference.json`` and ``reference.npz`` written into ``model_dir``, which registration then keeps with the
    version; the folder."""
    import torch

    from tasks.contracts.image_directory import ImageDirectory
    from tasks.contracts.model_directory import ModelDirectory
    from tasks.inference.loaded import LoadedModel  # torch: imported when a model runs, not with the flows
    from tasks.monitoring.reference import compute_reference

    model = LoadedModel(ModelDirectory(model_dir), device="cuda" if torch.cuda.is_available() else "cpu")
    compute_reference(model, ImageDirectory(validation_dir)).save(model_dir)
    return model_dir


@stage_task
def monitor(
    model: str,
    records: str,
    since: str = "1h",
    registry: str = "registry",
    validation: str | None = None,
    alpha: float = ALPHA,
    min_records: int = MIN_RECORDS,
) -> DriftReport:
    """Measure the window, publish ``model-drift``, emit the drift event when a figure drifted."""
    from tasks.monitoring.pictures import report_markdown
    from tasks.monitoring.window import look

    logger = get_run_logger()
    found = look(model, records, since, registry, validation, alpha, min_records)
    report = found.report
    for line in found.left_out:
        logger.warning("%s", line)
    create_markdown_artifact(
        key=ARTIFACT_KEY,
        markdown=report_markdown(report, found.reference, found.records, found.left_out),
        description=report.headline(),
    )
    logger.info("%s", report.headline())
    if report.drifted:
        emit_event(
            event=DRIFT_EVENT,
            resource=model_resource(report.model, report.version, flow_run.get_flow_name()),
            payload=report.payload(),
        )
    return report


@stage_task(retries=0)
def add_labelled_images(
    train_dir: str,
    validation_dir: str,
    labelled_dir: str,
    output: str,
    labelled_data: str,
    model_name: str | None,
    architecture: str,
) -> str:
    """Deterministic: never retried. The training images with the labelled batch's new ones at ``output``
    (labelled.py); artifact ``labelled-data`` (per class: added, skipped as already in train or validation); the event
    ``image-classifier.data.labelled`` about the model (``model_name``, or the name registration will give it)."""
    from tasks.contracts.image_directory import ImageDirectory
    from tasks.contracts.registry_layout import default_model_name
    from tasks.monitoring.labelled import add_labelled

    train = ImageDirectory(train_dir)
    merged, batch = add_labelled(
        train, ImageDirectory(validation_dir), ImageDirectory(labelled_dir), output, labelled_data
    )
    create_table_artifact(key=LABELLED_ARTIFACT_KEY, table=batch.rows(), description=batch.headline())
    get_run_logger().info("%s", batch.headline())
    name = model_name or default_model_name(train.manifest.source, architecture)
    emit_event(
        event=LABELLED_EVENT,
        resource=model_name_resource(name, flow_run.get_flow_name()),
        payload={"model": name, **batch.payload()},
    )
    return str(merged.root)
