"""Serve the deployments of deployments/prefect.yaml from this one process: no work pool, no worker.

    make server                                   # in one shell: the API and UI on 127.0.0.1:4200
    make serve                                    # in another: runs scheduled and UI-triggered runs here

For a laptop or a single GPU box. The same deployments (names, parameters, schedules) as `make deploy`,
read from the same file, so the two ways never drift apart.
"""

from __future__ import annotations

import yaml
from prefect import serve
from prefect.flows import load_flow_from_entrypoint
from prefect.schedules import Cron

from deployments.local import PROJECT_ROOT

DEPLOYMENT_FILE = PROJECT_ROOT / "deployments" / "prefect.yaml"


def runner_deployments(path=DEPLOYMENT_FILE) -> list:
    """One RunnerDeployment per entry of the deployment file (work pools and job variables do not apply)."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    deployments = []
    for entry in config["deployments"]:
        flow = load_flow_from_entrypoint(str(PROJECT_ROOT / entry["entrypoint"]))
        schedules = [
            Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True)) for s in entry.get("schedules", [])
        ]
        deployments.append(
            flow.to_deployment(
                name=entry["name"],
                description=entry.get("description"),
                parameters=entry.get("parameters"),
                schedules=schedules,
            )
        )
    return deployments


if __name__ == "__main__":
    serve(*runner_deployments())
