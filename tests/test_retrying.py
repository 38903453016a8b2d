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
