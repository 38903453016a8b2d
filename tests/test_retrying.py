"""The stages' retry rule on real Prefect task runs: a failure that can pass is retried, a mistake in the input
(a PipelineInputError, a pydantic ValidationError) runs once."""

import pytest
from prefect import flow
from pydantic import BaseModel

from tasks.errors import InvalidDatasetError
from tasks.retrying import stage_task

pytestmark = pytest.mark.integration


class Count(BaseModel):
    value: int


@pytest.mark.parametrize(
    ("failure", "runs"),
    [
        (ConnectionError("the storage dropped the connection"), 3),
        (InvalidDatasetError("the input is wrong"), 1),
        ("validation", 1),
    ],
)
def test_a_stage_retries_what_can_pass_and_not_a_mistake_in_the_input(prefect_server, failure, runs):
    calls = []

    @stage_task(retries=2, retry_delay_seconds=0)
    def flaky() -> None:
        calls.append(1)
        if failure == "validation":
            Count.model_validate({"value": "not a number"})
        raise failure

    @flow
    def one_stage() -> None:
        flaky()

    with pytest.raises(Exception):  # noqa: B017 (the failure itself, whichever it is)
        one_stage()
    assert len(calls) == runs


def test_a_stage_task_is_named_after_its_function_bare_or_with_options():
    @stage_task
    def keep_going() -> None: ...

    @stage_task(retries=0)
    def once() -> None: ...

    assert (keep_going.name, keep_going.retries) == ("keep_going", 2)
    assert (once.name, once.retries) == ("once", 0)


def test_the_deployments_beat_at_the_pace_of_the_command_lines_runs():
    import yaml

    from deployments.automations import heartbeat_seconds
    from deployments.deploy import DEPLOYMENT_FILE
    from tasks.outages import RUN_HEARTBEAT_S

    assert heartbeat_seconds(yaml.safe_load(DEPLOYMENT_FILE.read_text())) == RUN_HEARTBEAT_S


def test_a_command_lines_own_run_on_a_lasting_server_beats_tagged_and_rides_out_a_restart(monkeypatch):
    """flows/cli.py runs its flow inside ``on_a_lasting_server()``: the beat, the tag the lost-host automation
    watches and the client's retries; none of it on a temporary server, and no tag for a slower beat."""
    from prefect.context import TagsContext
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_CLIENT_MAX_RETRIES,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    from flows.cli import on_a_lasting_server

    monkeypatch.delenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", raising=False)
    monkeypatch.delenv("PREFECT_CLIENT_MAX_RETRIES", raising=False)
    with temporary_settings({PREFECT_API_URL: None}), on_a_lasting_server():
        assert PREFECT_CLIENT_MAX_RETRIES.value() == 5 and "beats-every-60s" not in TagsContext.get().current_tags
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        with on_a_lasting_server():
            assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == 60 and PREFECT_CLIENT_MAX_RETRIES.value() == 7
            assert "beats-every-60s" in TagsContext.get().current_tags
        monkeypatch.setenv("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "180")
        with on_a_lasting_server():
            assert "beats-every-60s" not in TagsContext.get().current_tags
