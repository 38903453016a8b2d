"""The process a worker starts for a run of one of our deployments: Prefect's own engine (``python -m
prefect.engine``), entered once the Prefect API answers, with a client that rides out a server restart.

    python -m deployments.engine          # what the deployments' job variable ``command`` runs (deployments/deploy.py)

Why: a worker starts a flow run's process, and the server stops (an upgrade, a restart) before that process has
asked it anything. Prefect's client retries a refused connection only once it has connected at least once (a
wrong URL fails fast), so the engine's first request (reading its flow run) failed at once, the process exited 1
and the worker reported the run Crashed when the server came back (bench/load.py: 2 of 40 runs through a 23 s
restart). Here the first request is retried until the server answers (``WAIT_FOR_SERVER_S`` at most), on the client
the engine then uses for the whole run (Prefect's sync client context): every later request of the run retries a
refused connection as a connected client does (``PREFECT_CLIENT_MAX_RETRIES``, tasks/outages). Two more of the
engine's first steps would otherwise meet a restart unprepared: loading the flow (a new client: the flow is loaded
from its file instead, ``entrypoint_here``) and opening the events socket that records the task runs
(tasks/outages/prefect_events.py).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import time
from pathlib import Path

from tasks.outages.settings import WAIT_FOR_SERVER_S

WORKING_DIRECTORY_STEP = "prefect.deployments.steps.set_working_directory"


class Waiting:
    """Says once, on stderr (the worker's log), that the run's process waits for the API, and how long it took."""

    def __init__(self, within_s: float) -> None:
        self.started, self.within_s, self.said = time.monotonic(), within_s, False

    def again(self, error: BaseException, every_s: float) -> None:
        """Sleep ``every_s`` before the next try; raises ``error`` once ``within_s`` has passed."""
        if time.monotonic() - self.started > self.within_s:
            raise error
        if not self.said:
            print(f"waiting for the Prefect API to answer: {error}", file=sys.stderr, flush=True)
            self.said = True
        time.sleep(every_s)

    def done(self) -> None:
        if self.said:
            print(
                f"the Prefect API answered after {time.monotonic() - self.started:.0f} s", file=sys.stderr, flush=True
            )


def client_context(stack: contextlib.ExitStack, within_s: float = WAIT_FOR_SERVER_S, every_s: float = 1.0):
    """Prefect's sync client context, entered in ``stack`` once the API has answered its client (Prefect's version
    check on entering, then a health check): the client counts as connected from then on."""
    from prefect.context import SyncClientContext

    waiting = Waiting(within_s)
    while True:
        context = SyncClientContext()
        try:
            stack.enter_context(context)
            break
        except RuntimeError as error:  # Prefect's version check: "Failed to reach API at …"
            context.client.__exit__(None, None, None)
            waiting.again(error, every_s)
    while (error := context.client.api_healthcheck()) is not None:  # when the version check is switched off
        waiting.again(error, every_s)
    waiting.done()
    return context


def entrypoint_here(client) -> str | None:
    """The run's flow as its deployment names it (``path:function``) when the deployment's pull steps only set the
    working directory to this one (ours: deployments/prefect.yaml, and ``working_dir`` is the project root). The
    engine then loads the flow from that file (Prefect's own ``PREFECT__FLOW_ENTRYPOINT``) instead of reading the
    deployment again through a new client, whose first request would not ride out a restart."""
    if not (flow_run_id := os.environ.get("PREFECT__FLOW_RUN_ID")):
        return None  # Prefect's engine says what it needs
    flow_run = client.read_flow_run(flow_run_id)
    if flow_run.deployment_id is None:
        return None
    deployment = client.read_deployment(flow_run.deployment_id)
    here = Path.cwd().resolve()
    for step in deployment.pull_steps or []:
        (name, options), *others = step.items()
        if others or name != WORKING_DIRECTORY_STEP or Path(options.get("directory", "")).resolve() != here:
            return None
    return deployment.entrypoint if deployment.entrypoint and ":" in deployment.entrypoint else None


def main() -> None:
    from tasks.outages.prefect_events import events_wait_for_the_server

    # A session of its own, as Prefect starts its engine when no command is given: a signal meant for the worker's
    # process group (its stop) does not reach the run, and one meant for the run's group does not reach the worker.
    with contextlib.suppress(OSError):  # already a session leader
        os.setsid()
    with contextlib.ExitStack() as stack:
        context = client_context(stack)
        stack.enter_context(events_wait_for_the_server())
        if "PREFECT__FLOW_ENTRYPOINT" not in os.environ and (entrypoint := entrypoint_here(context.client)):
            os.environ["PREFECT__FLOW_ENTRYPOINT"] = entrypoint
        sys.argv = ["prefect.engine"]
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
