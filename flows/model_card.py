"""The ``update-model-card`` flow: the model card published again after a change made outside any run (the
registry's command line, flows/registry.py). Prefect creates artifacts inside a flow or task run (creating one
outside is deprecated), so this small flow run does it; the card itself is tasks/registry/prefect_tasks.py's
``publish_model_card``, which a registration publishes too."""

from __future__ import annotations

from prefect import flow
from prefect.settings import get_current_settings

from flows.console import quiet_console
from tasks.registry.prefect_tasks import publish_model_card


@flow(name="update-model-card", log_prints=True)
def update_model_card(registry: str, name: str) -> str:
    """Publish the card of model ``name`` in ``registry`` again; returns its artifact key."""
    return publish_model_card(registry, name)


def update_model_card_if_connected(registry: str, name: str) -> str:
    """For the command line: publish the card when a Prefect API is configured (never starting a server of
    its own); what happened, in one line. The flow run's own INFO lines stay off the console (the API has them)."""
    if not get_current_settings().api.url:
        return f"model card of {name} not updated: no Prefect API configured (set PREFECT_API_URL)"
    with quiet_console():
        return f"model card updated: artifact {update_model_card(registry, name)}"
