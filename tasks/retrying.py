"""Retry policy shared by the Prefect tasks: transient failures retry, mistakes in the input do not."""

from __future__ import annotations

from tasks.errors import PipelineInputError


def retry_unless_input_error(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: False when the run failed on a PipelineInputError, or on a pydantic
    ValidationError (parameters or a record that do not validate: the same input fails the same way)."""
    from pydantic import ValidationError

    try:
        state.result()
    except (PipelineInputError, ValidationError):
        return False
    except BaseException:
        return True
    return True


def stage_task(fn=None, *, retries: int = 2, retry_delay_seconds: float = 2):
    """The one Prefect task decorator of the stages, bare (``@stage_task``) or with options
    (``@stage_task(retries=0)``): ``retries`` when a failure can pass (storage, network, a lost process), none on a
    mistake in the input, and no result cache (every stage reads and writes files). The task is named after its
    function (Prefect's default), so a task run is looked up by the function's name."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    decorate = task(
        retries=retries,
        retry_delay_seconds=retry_delay_seconds,
        retry_condition_fn=retry_unless_input_error,
        cache_policy=NO_CACHE,
    )
    return decorate if fn is None else decorate(fn)
