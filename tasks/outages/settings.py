"""The settings that let a run ride out a server restart, and the heartbeat that tells a lost run (no Prefect)."""

from __future__ import annotations

# Prefect client settings for every process that talks to the server while work goes on (workers, deployment runs,
# the command lines' own runs): a request the server does not answer (stopped for an upgrade or a restart) is tried
# again after 2, 4, 8 … 128 s (Prefect's back-off, ±20% jitter), about 4 minutes in all, before the run gives up on
# it. Measured with bench/load.py's restart round (BENCHMARKS.md, docs/operations.md).
RIDE_OUT_SERVER_RESTART = {"PREFECT_CLIENT_MAX_RETRIES": "7"}


def ride_out_in_this_environment() -> None:
    """``RIDE_OUT_SERVER_RESTART`` in this process's environment, which the processes it starts inherit (a worker's,
    ``make serve``'s runs); a value already set wins."""
    import os

    for setting, value in RIDE_OUT_SERVER_RESTART.items():
        os.environ.setdefault(setting, value)


# How long a deployment run's process waits for the server's first answer before it gives up (deployments/engine.py):
# about the client's retries above.
WAIT_FOR_SERVER_S = 240.0

# How often a run of ours tells the server it is alive (PREFECT_FLOWS_HEARTBEAT_FREQUENCY): a deployment run
# (deployments/prefect.yaml sets it in each one's environment) and a command line's own run on a lasting server
# (flows/cli.py). Such a run carries the tag ``heartbeat_tag(RUN_HEARTBEAT_S)``, which the automation that sets a
# run Crashed once its beats stop watches (deployments/automations.py); a run without it (one started from your own
# code, beating at Prefect's default 180 s) is left alone.
RUN_HEARTBEAT_S = 60


def heartbeat_tag(seconds: int) -> str:
    return f"beats-every-{seconds}s"
