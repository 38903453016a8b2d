"""`make deploy`'s automations as built: the heartbeat pace read from prefect.yaml, the run crashed after missed
beats, and the re-run given the crashed run's parameters."""

import json
from datetime import timedelta
from types import SimpleNamespace
from uuid import uuid4

import pytest
import yaml

from deployments.automations import (
    HEARTBEAT_SETTING,
    RERUN_PARAMETERS,
    heartbeat_seconds,
    rerun_automation,
    zombie_automation,
)
from deployments.local import PROJECT_ROOT


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
