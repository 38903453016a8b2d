"""Riding out a Prefect server's outage (an upgrade, a restart): what every process of ours that talks to the
server while work goes on needs, so that no run crashes and no task run goes missing while the server is down
(docs/operations.md, "Upgrading or restarting the server"; bench/load.py measures it).

- ``settings``: the client's retries, and the heartbeat pace and tag the lost-host automation watches (no Prefect);
- ``prefect_events``: the events client that waits for the server instead of dropping what it had to send.

Used by workers (deployments/worker.py), deployment runs (deployments/deploy.py, deployments/engine.py) and the
command lines' own runs (flows/cli.py).
"""

from tasks.outages.settings import RIDE_OUT_SERVER_RESTART, RUN_HEARTBEAT_S, heartbeat_tag, ride_out_in_this_environment

__all__ = ["RIDE_OUT_SERVER_RESTART", "RUN_HEARTBEAT_S", "heartbeat_tag", "ride_out_in_this_environment"]
