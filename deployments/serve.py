"""Serve the deployments of deployments/prefect.yaml from this one process: no work pool, no worker.

    make server                                   # in one shell: the API and UI on 127.0.0.1:4200
    make serve                                    # in another: runs scheduled and UI-triggered runs here

For a laptop or a single GPU box. The same deployments (parameters, schedules) as `make deploy`, read from
the same file, so the two ways never drift apart; each is named with ``-served`` after the file's name
(`train-pipeline/retrain-digits-served`): a served deployment is a different kind of deployment (no pool, no
pull steps), and taking over the name of one `make deploy` made would crash both its runs and the worker's.
As with `make deploy`, each schedule stays switched on or off as it is on the server.
"""

from __future__ import annotations

import yaml
from prefect import serve
from prefect.flows import load_flow_from_entrypoint
from prefect.schedules import Cron

from deployments.deploy import DEPLOYMENT_FILE, keep_schedule_states, read_schedule_states
from deployments.local import PROJECT_ROOT
from tasks.outages import ride_out_in_this_environment

SERVED_SUFFIX = "-served"


def runner_deployments(path=DEPLOYMENT_FILE) -> list:
    """One RunnerDeployment per entry of the deployment file (work pools and job variables do not apply)."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    flows = [load_flow_from_entrypoint(str(PROJECT_ROOT / entry["entrypoint"])) for entry in config["deployments"]]
    names = [f"{flow.name}/{entry['name']}{SERVED_SUFFIX}" for flow, entry in zip(flows, config["deployments"])]
    states = read_schedule_states(names)
    deployments = []
    for flow, entry, name in zip(flows, config["deployments"], names):
        schedules = [
            Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True))
            for s in keep_schedule_states(entry.get("schedules", []), states.get(name, {}))
        ]
        deployments.append(
            flow.to_deployment(
                name=entry["name"] + SERVED_SUFFIX,
                description=entry.get("description"),
                parameters=entry.get("parameters"),
                schedules=schedules,
            )
        )
    return deployments


def main(argv: list[str] | None = None) -> None:
    """``--help`` says what it does; no PREFECT_API_URL, or no server answering there, is one line and exit 2."""
    from flows.cli import server_command

    server_command("python -m deployments.serve", __doc__, argv)
    ride_out_in_this_environment()  # the served runs' processes inherit it
    serve(*runner_deployments())


if __name__ == "__main__":
    main()
