"""`make deploy`'s automations as built: the heartbeat pace read from prefect.yaml, the run crashed after missed
beats, and the re-run given the crashed run's parameters; the retraining on events, on a real Prefect server of
their own: a storm of drift events starts one training run from the drifted version's weights, a labelled batch
one run given its folder and the production version's weights, and a training run's own events none."""

import asyncio
import json
import socket
from datetime import timedelta
from types import SimpleNamespace
from uuid import uuid4

import pytest
import yaml

from deployments.automations import (
    HEARTBEAT_SETTING,
    RERUN_PARAMETERS,
    heartbeat_seconds,
    labelled_automation,
    rerun_automation,
    retrain_automation,
    zombie_automation,
)
from deployments.local import EPHEMERAL_PORTS, PORT_TAKEN, PROJECT_ROOT, PrefectStack, free_port
from tasks.monitoring.events import (
    DRIFT_EVENT,
    LABELLED_EVENT,
    TRAINING_FLOW,
    model_name_resource,
    model_resource,
)
from tests.helpers import wait_for


def deployment(name: str, **env: str) -> dict:
    return {"name": name, "work_pool": {"job_variables": {"env": env}}}


def test_the_heartbeat_is_the_slowest_the_deployments_set_and_one_without_is_refused():
    assert heartbeat_seconds({"deployments": [deployment("a", **{HEARTBEAT_SETTING: "60"})]}) == 60
    mixed = [deployment("a", **{HEARTBEAT_SETTING: "60"}), deployment("b", **{HEARTBEAT_SETTING: "90"})]
    assert heartbeat_seconds({"deployments": mixed}) == 90
    with pytest.raises(ValueError, match=f"deployment 'c' sets no {HEARTBEAT_SETTING} in its job variables' env"):
        heartbeat_seconds({"deployments": [*mixed, deployment("c")]})


def test_every_shipped_deployment_beats_faster_than_prefects_default():
    config = yaml.safe_load((PROJECT_ROOT / "deployments" / "prefect.yaml").read_text())
    assert 30 < heartbeat_seconds(config) < 180  # Prefect takes no less than 30 s; its default is 180 s


def test_a_tagged_run_silent_for_the_wait_is_set_crashed_saying_why():
    automation = zombie_automation("beats-every-60s", timedelta(seconds=180))
    trigger = automation.trigger
    assert trigger.match_related["prefect.resource.id"] == ["prefect.tag.beats-every-60s"]
    assert trigger.after == {"prefect.flow-run.heartbeat"} and trigger.within == timedelta(seconds=180)
    assert "prefect.flow-run.Completed" in trigger.expect and "prefect.flow-run.heartbeat" in trigger.expect
    (crash,) = automation.actions
    assert crash.state.value == "CRASHED" and crash.message.startswith("No heartbeat for 180 s")


def test_the_rerun_gets_the_crashed_runs_parameters_and_names_the_run_it_replaces():
    from prefect.server.utilities.user_templates import render_user_template_sync

    deployment_id = str(uuid4())
    automation = rerun_automation([deployment_id])
    assert automation.trigger.expect == {"prefect.flow-run.Crashed"}
    assert automation.trigger.match_related["prefect.resource.id"] == [f"prefect.deployment.{deployment_id}"]
    crashed = SimpleNamespace(id=uuid4(), parameters={"train_data": "s3://b/photos", "training": {"epochs": 12}})
    rendered = render_user_template_sync(RERUN_PARAMETERS["value"]["template"], {"flow_run": crashed})
    assert json.loads(rendered) == {**crashed.parameters, "replaces_run": str(crashed.id)}


def test_the_retraining_runs_the_training_deployment_at_most_once_an_interval_and_never_on_a_trainings_event():
    deployment_id = str(uuid4())
    automation = retrain_automation(deployment_id, timedelta(hours=6))
    trigger, (run,) = automation.trigger, automation.actions
    assert trigger.expect == {DRIFT_EVENT} and trigger.within == timedelta(hours=6) and trigger.threshold == 1
    assert trigger.posture.value == "Reactive" and str(run.deployment_id) == deployment_id
    assert trigger.match.matches(model_resource("digits", 3, "monitor"))
    assert trigger.match.matches(model_resource("digits", 3, None))  # the monitor run from Python, not a flow
    assert not trigger.match.matches(model_resource("digits", 3, TRAINING_FLOW))


@pytest.fixture(scope="module")
def events_server(prefect_home):
    """A Prefect server for these tests alone. On the run's shared server the triggers service evaluates, in order,
    every event the other test processes' flows send (thousands of task-run states): CI saw a probe's event still
    waiting after 120 s. The clients made here (the automations, the runs read) find it in Prefect's settings.

    Its first port is taken by another process as it starts (as a server of another test process once took the
    shared server's): the stack starts it again on another port (``taken``: the port it was first given)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    stack = PrefectStack(home=prefect_home("automations-home"))
    stack.taken = stack.port
    with socket.create_server(("127.0.0.1", stack.taken)):
        stack.start()
    try:
        with temporary_settings({PREFECT_API_URL: stack.api_url}):
            yield stack
    finally:
        stack.stop()


def test_a_port_taken_as_the_server_starts_is_left_for_another(events_server):
    assert events_server.port != events_server.taken
    assert f"Port {events_server.taken} {PORT_TAKEN}" in events_server.log_text()


def test_a_test_servers_port_is_drawn_below_the_ports_the_kernel_hands_out():
    """Between free_port and the bind of the server it is for, no outgoing connection and no process asking the
    kernel for a port can take it."""
    ephemeral = int(EPHEMERAL_PORTS.read_text().split()[0])
    ports = {free_port() for _ in range(5)}
    assert len(ports) > 1 and all(10_000 <= port < ephemeral for port in ports), ports
    with socket.create_server(("127.0.0.1", ports.pop())):
        pass


def emit(stack, *events: tuple[str, dict, dict]) -> None:
    """Send ``events`` ((name, resource, payload) each) to ``stack``'s server over one websocket, in order. Not
    through ``prefect.events.emit_event``: its worker is one per process and keeps the first server it was started
    for."""
    from prefect.events import Event
    from prefect.events.clients import PrefectEventsClient

    async def send() -> None:
        async with PrefectEventsClient(stack.api_url) as client:
            for name, resource, payload in events:
                await client.emit(Event(event=name, resource=resource, payload=payload))

    asyncio.run(send())


def new_deployment(name: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.create_deployment(client.create_flow_from_name(name), name))


def runs_of(deployment_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def live_probe(stack, name: str):
    """A probe automation that runs a deployment of its own on every event of its own, created after the automations
    under test and waited for until it fires: the server loads a new automation into its triggers service only after
    the creation was answered (on SQLite, a task scheduled after the commit), and an event evaluated before that is
    never matched (CI once saw a batch's announcement start no run). Loads happen in the order of the creations, so
    once the probe fires the automations made before it are loaded. The triggers service also evaluates events in the
    order they came: once the probe's run for an event is there, the events sent before it have been evaluated.
    Returns the probe's deployment and automation (to delete)."""
    probed = new_deployment(f"{name}-probe")
    probe = retrain_automation(probed, timedelta(0))
    probe.name, probe.trigger.match.root["prefect.resource.id"] = (
        f"{name}-probe",
        f"image-classifier.model.{name}-probe.*",
    )
    probe = probe.create()
    for _ in range(12):  # an event sent before the probe was loaded is lost: sent again after 10 s
        runs = len(runs_of(probed))
        emit(stack, (DRIFT_EVENT, model_resource(f"{name}-probe", 1, "monitor"), {}))
        try:
            wait_for(lambda: len(runs_of(probed)) > runs, 10, interval=0.5, what="the probe's run")  # noqa: B023
            return probed, probe
        except AssertionError:
            continue
    probe.delete()
    raise AssertionError("the probe automation never fired in 120 s")


def automation_under_test(stack, name: str, build, resource_id: str):
    """``build(deployment, window)``'s automation for a new deployment named ``name``, with a window of an hour and
    matching ``resource_id``, created, then a live probe after it: the deployment, the automation, the probe's
    deployment and the probe."""
    deployment = new_deployment(name)
    automation = build(deployment, timedelta(hours=1))
    automation.name, automation.trigger.match.root["prefect.resource.id"] = name, resource_id
    return deployment, automation.create(), *live_probe(stack, name)


def test_a_storm_of_drift_events_starts_one_training_and_a_trainings_own_event_none(events_server):
    name = f"storm-{uuid4().hex[:8]}"
    training, automation, probed, probe = automation_under_test(
        events_server, name, retrain_automation, f"image-classifier.model.{name}.*"
    )

    def trainings_after(*events, trainings: int) -> int:
        probes = len(runs_of(probed))
        emit(events_server, *events, (DRIFT_EVENT, model_resource(f"{name}-probe", 1, "monitor"), {}))
        evaluated = lambda: len(runs_of(probed)) > probes and len(runs_of(training)) >= trainings  # noqa: E731
        wait_for(
            evaluated,
            120,
            interval=0.5,
            what=lambda: f"the probe's run and {trainings} training runs: {runs_of(training)}",
        )
        return len(runs_of(training))

    try:
        assert trainings_after((DRIFT_EVENT, model_resource(name, 1, TRAINING_FLOW), {}), trainings=0) == 0
        storm = [(DRIFT_EVENT, model_resource(name, version, "monitor"), {}) for version in range(20)]
        assert trainings_after(*storm, trainings=1) == 1
        (run,) = runs_of(training)
        # From the version whose drift fired it: which of the storm's comes first to the trigger, the server decides.
        assert run.parameters.keys() == {"warm_start"}
        assert run.parameters["warm_start"] in {f"{name}/{version}" for version in range(20)}, run.parameters
    finally:
        automation.delete()
        probe.delete()


def test_an_announced_batch_runs_the_training_deployment_with_it_and_a_trainings_own_announcement_none(events_server):
    name = f"announced-{uuid4().hex[:8]}"
    deployment, automation, _, probe = automation_under_test(
        events_server, name, labelled_automation, f"image-classifier.model.{name}"
    )
    try:
        # Had the training's own event been matched, its run would carry its folder, and the window would drop the
        # person's.
        emit(
            events_server,
            (LABELLED_EVENT, model_name_resource(name, TRAINING_FLOW), {"labelled_data": "trained-on"}),
            (LABELLED_EVENT, model_name_resource(name, "a person"), {"labelled_data": "/data/to-label"}),
        )
        (run,) = wait_for(lambda: runs_of(deployment), 120, interval=0.5, what="the training deployment's run")
        assert run.parameters == {"labelled_data": "/data/to-label", "warm_start": f"{name}@production"}
    finally:
        automation.delete()
        probe.delete()
