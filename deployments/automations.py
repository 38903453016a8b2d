"""The automations that notice a lost host and carry its work on: a run of one of deployments/prefect.yaml's
deployments whose heartbeats stop is set Crashed (Prefect's "detect zombie flows"), and a training run set
Crashed is run again, on whichever worker of the pool is free.

A deployment run beats every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (its job variables' environment,
deployments/prefect.yaml) while its process lives, and so does a command line's own run on a lasting server
(``image-classifier train|score|sweep``: flows/cli.py sets the same pace); a host powered off, its worker's whole
process tree killed, or the command's process killed, stops the beats and sends no state change, so the run would
stay Running for ever. The automation waits, for each flow run, for the next heartbeat or a final state after
each heartbeat, and sets the run Crashed once none came for ``MISSED_HEARTBEATS`` intervals. It watches only the
runs tagged ``beats-every-60s`` (``heartbeat_tag``, tasks/outages): the deployments' runs (``make deploy`` tags
them) and the command lines' own, whose pace is known; any other run beats at Prefect's default pace (180 s) and
must not be crashed for beating slowly.

The second automation runs the crashed run's deployment again with the crashed run's parameters and
``replaces_run`` set to its id: the new run takes over the lost run's folder and resumes from its checkpoint
(tasks/launch/lost_runs.py), and stops at once, saying why, once a training has been run again ``MAX_RERUNS`` times.

Two more run the training deployment on the project's own events (tasks/monitoring/events.py), each at most once an
interval and never on an event a training run emitted: a drift (the monitor's), with the deployment's parameters;
a labelled batch announced, with ``labelled_data`` the folder the event names.

``make deploy`` (deployments/deploy.py) creates them, or updates them in place: one automation of each name,
whose other actions (a notification someone added in the UI) and on/off switch a re-deploy keeps.
"""

from __future__ import annotations

from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import Action, ChangeFlowRunState, RunDeployment
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

from tasks.monitoring.events import DRIFT_EVENT, EMITTED_BY, LABELLED_EVENT, TRAINING_FLOW

HEARTBEAT_SETTING = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
ZOMBIE_AUTOMATION = "Crash runs whose host was lost (no heartbeat)"
MISSED_HEARTBEATS = 3  # a heartbeat late by one or two intervals (a busy server) is not a lost host
RERUN_AUTOMATION = "Run a training again when its run crashed (host lost)"
# The re-run's parameters: the crashed run's, with replaces_run naming it (the server renders this when it fires).
RERUN_PARAMETERS = {
    "__prefect_kind": "json",
    "value": {
        "__prefect_kind": "jinja",
        "template": "{{ dict(flow_run.parameters, replaces_run=flow_run.id|string) | tojson }}",
    },
}
FINAL_EVENTS = {f"prefect.flow-run.{state}" for state in ("Completed", "Failed", "Cancelled", "Crashed")}
RETRAIN_AUTOMATION = "Retrain when the served model drifts"
RETRAIN_INTERVAL = timedelta(hours=24)  # make deploy's default: at most one retraining a day however many events
LABELLED_AUTOMATION = "Retrain when a labelled batch is announced"
# The retraining's parameters (the server renders them when it fires): a warm start from the version that drifted
# (the drift event's resource names it, name/3) or from the production version of the model a labelled batch is
# for; and the labelled batch's folder, as its event names it.
DRIFT_PARAMETERS = {"warm_start": {"__prefect_kind": "jinja", "template": "{{ event.resource.name }}"}}
LABELLED_PARAMETERS = {
    "labelled_data": {"__prefect_kind": "jinja", "template": "{{ event.payload.labelled_data }}"},
    "warm_start": {"__prefect_kind": "jinja", "template": "{{ event.resource.name }}@production"},
}


def heartbeat_seconds(config: dict) -> int:
    """The heartbeat frequency the deployments of ``config`` (prefect.yaml, loaded) set, the slowest if they
    differ; raises ValueError when one sets none (its runs would beat at Prefect's default pace)."""
    frequencies = []
    for entry in config["deployments"]:
        env = entry.get("work_pool", {}).get("job_variables", {}).get("env", {})
        if HEARTBEAT_SETTING not in env:
            raise ValueError(f"deployment {entry['name']!r} sets no {HEARTBEAT_SETTING} in its job variables' env")
        frequencies.append(int(env[HEARTBEAT_SETTING]))
    return max(frequencies)


def runs_of(ids: list[str], role: str = "deployment") -> dict[str, ResourceSpecification]:
    """A trigger's resources: the flow runs of the deployments ``ids`` (or, with ``role`` "tag", tagged with one
    of them)."""
    return {
        "match": ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        "match_related": ResourceSpecification(
            {"prefect.resource.role": role, "prefect.resource.id": [f"prefect.{role}.{id}" for id in ids]}
        ),
    }


def zombie_automation(tag: str, within: timedelta) -> Automation:
    """Sets a run tagged ``tag`` (it beats at a known pace: tasks/outages) Crashed when, after a heartbeat,
    neither another heartbeat nor a final state came ``within`` that time."""
    return Automation(
        name=ZOMBIE_AUTOMATION,
        description=(
            f"A run tagged {tag} (a run of a deployment of deployments/prefect.yaml, or a command line's own run) that "
            f"sent no heartbeat for {within.total_seconds():g} s is set Crashed: its host, worker or process was lost. "
            "Made by `make deploy` (deployments/automations.py)."
        ),
        trigger=EventTrigger(
            **runs_of([tag], role="tag"),
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *FINAL_EVENTS},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=within,
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=(
                    f"No heartbeat for {within.total_seconds():g} s: the run's host, worker or process was lost "
                    f"(automation {ZOMBIE_AUTOMATION!r})."
                ),
            )
        ],
    )


def rerun_automation(deployment_ids: list[str]) -> Automation:
    """Runs a crashed run of one of ``deployment_ids`` (the training pipeline's) again: the same deployment, its
    parameters and ``replaces_run``, on whichever worker of the pool takes it."""
    return Automation(
        name=RERUN_AUTOMATION,
        description=(
            "A training run set Crashed (its host or worker lost) is run again with its parameters and "
            "replaces_run, and resumes from its checkpoint when its run folder is reachable (S3 or a shared "
            "folder). Made by `make deploy` (deployments/automations.py)."
        ),
        trigger=EventTrigger(
            **runs_of(deployment_ids),
            expect={"prefect.flow-run.Crashed"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[RunDeployment(source="inferred", parameters=RERUN_PARAMETERS)],
    )


def retrain_on(
    event: str, name: str, deployment_id: str, every: timedelta, description: str, parameters: dict | None = None
) -> Automation:
    """Runs the training deployment ``deployment_id`` on ``event`` about a model, at most once ``every``: a reactive
    trigger fires on its first event, then ignores the others until its window ends (Prefect's own bucketing). An
    event whose emitting flow is the training pipeline's is never matched: a training run cannot start itself."""
    return Automation(
        name=name,
        description=f"{description}, at most once every {every.total_seconds() / 3600:g} h; its version goes "
        "through the champion/challenger evaluation and approval before the alias moves. Made by `make deploy` "
        "(deployments/automations.py).",
        trigger=EventTrigger(
            match=ResourceSpecification(
                {"prefect.resource.id": "image-classifier.model.*", EMITTED_BY: f"!{TRAINING_FLOW}"}
            ),
            expect={event},
            posture=Posture.Reactive,
            threshold=1,
            within=every,
        ),
        actions=[RunDeployment(source="selected", deployment_id=deployment_id, parameters=parameters or {})],
    )


def retrain_automation(deployment_id: str, every: timedelta = RETRAIN_INTERVAL) -> Automation:
    """Runs the training deployment, with its own parameters, when a model drifts (the monitor's event), starting
    from the weights of the version that drifted (``warm_start``)."""
    description = (
        f"A drift event ({DRIFT_EVENT}, emitted by the monitor) runs the training deployment, starting from the "
        "drifted version's weights"
    )
    return retrain_on(DRIFT_EVENT, RETRAIN_AUTOMATION, deployment_id, every, description, DRIFT_PARAMETERS)


def labelled_automation(deployment_id: str, every: timedelta = RETRAIN_INTERVAL) -> Automation:
    """Runs the training deployment with the labelled batch an event announces (its payload's ``labelled_data``:
    a folder the training hosts read) added to its training images, starting from the weights of the model's
    production version. A training run that added a batch announces it too, but as the training pipeline: that
    event never starts another training."""
    description = (
        f"A labelled batch announced ({LABELLED_EVENT}, its payload's labelled_data a folder) runs the training "
        "deployment with it, starting from the production version's weights"
    )
    return retrain_on(LABELLED_EVENT, LABELLED_AUTOMATION, deployment_id, every, description, LABELLED_PARAMETERS)


def ensure_automation(wanted: Automation, own: type[Action]) -> Automation:
    """Creates ``wanted`` on the server (PREFECT_API_URL), or updates the one of its name: its trigger and its
    ``own`` action replaced, the other actions added to it (a notification) and whether it is enabled kept."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(name=wanted.name)
    if not existing:
        return wanted.create()
    wanted.id, wanted.enabled = existing[0].id, existing[0].enabled
    wanted.actions += [a for a in existing[0].actions if not isinstance(a, own)]
    wanted.update()
    return wanted


def ensure_zombie_automation(tag: str, within: timedelta) -> Automation:
    return ensure_automation(zombie_automation(tag, within), ChangeFlowRunState)


def ensure_rerun_automation(deployment_ids: list[str]) -> Automation:
    return ensure_automation(rerun_automation(deployment_ids), RunDeployment)


def ensure_retrain_automation(deployment_id: str, every: timedelta = RETRAIN_INTERVAL) -> Automation:
    return ensure_automation(retrain_automation(deployment_id, every), RunDeployment)


def ensure_labelled_automation(deployment_id: str, every: timedelta = RETRAIN_INTERVAL) -> Automation:
    return ensure_automation(labelled_automation(deployment_id, every), RunDeployment)
