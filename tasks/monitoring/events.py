"""The monitoring events' names and resources: what the monitor (a drift) and the training pipeline (a labelled
batch added) emit and the retraining automations (deployments/automations.py) match. Imports nothing of Prefect's."""

from __future__ import annotations

DRIFT_EVENT = "image-classifier.model.drift"
LABELLED_EVENT = "image-classifier.data.labelled"
# A resource label every event of ours carries: the flow that emitted it, so that the training pipeline's own events
# can never start a training.
EMITTED_BY = "image-classifier.emitted-by"
TRAINING_FLOW = "train-pipeline"


def model_resource(name: str, version: int, flow: str | None) -> dict[str, str]:
    """The version as an event's resource (``flow``: the emitting flow's name, None outside a flow run)."""
    return {
        "prefect.resource.id": f"image-classifier.model.{name}.{version}",
        "prefect.resource.name": f"{name}/{version}",
        EMITTED_BY: flow or "none",
    }


def model_name_resource(name: str, flow: str | None) -> dict[str, str]:
    """The model ``name`` (no version yet: a labelled batch is for the next one) as an event's resource."""
    return {
        "prefect.resource.id": f"image-classifier.model.{name}",
        "prefect.resource.name": name,
        EMITTED_BY: flow or "none",
    }
