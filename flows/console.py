"""Prefect's console filtered for a while: the command lines keep some of a run's records off the terminal (a failure
they tell in one line, a bookkeeping flow run's chatter) while Prefect's API handler (the run's logs in the UI) and
any log file still get every one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from prefect.logging.handlers import PrefectConsoleHandler


@contextlib.contextmanager
def console_filter(keep: logging.Filter | Callable[[logging.LogRecord], bool]) -> Iterator[None]:
    """Within the block, Prefect's console handler shows only the records ``keep`` lets through."""
    consoles = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    for handler in consoles:
        handler.addFilter(keep)
    try:
        yield
    finally:
        for handler in consoles:
            handler.removeFilter(keep)


def quiet_console(level: int = logging.WARNING) -> contextlib.AbstractContextManager[None]:
    """Only records of ``level`` and above on the console: for a small bookkeeping flow run that a command makes
    on the side."""
    return console_filter(lambda record: record.levelno >= level)
