"""Retry policy shared by the Prefect tasks: transient failures retry, mistakes in the input do not."""

from __future__ import annotations

from tasks.errors import PipelineInputError


def retry_unless_input_error(task, task_run, state) -> bool:
    """Prefect ``retry_condition_fn``: False when the run failed on a PipelineInputError."""
    try:
        state.result()
    except PipelineInputError:
        return False
    except BaseException:
        return True
    return True
