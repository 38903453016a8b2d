"""The terminal of the command lines: ``CommandParser`` (argparse whose error is one line), and Prefect's console,
filtered for a while: the command lines keep some of a run's records off the terminal while Prefect's API handler
(the run's logs in the UI) and any log file still get every one."""

from __future__ import annotations

import argparse
import contextlib
import logging
import typing
from collections.abc import Callable, Iterator
from typing import Any


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose error is one line: ``prog: error: ... (--help lists the flags)``."""

    def __init__(self, *args: Any, hint: str = "--help lists the flags", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.hint})\n")


@contextlib.contextmanager
def console_filter(keep: logging.Filter | Callable[[logging.LogRecord], bool]) -> Iterator[None]:
    """Within the block, Prefect's console handler shows only the records ``keep`` lets through."""
    from prefect.logging.handlers import PrefectConsoleHandler

    consoles = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    for handler in consoles:
        handler.addFilter(keep)
    try:
        yield
    finally:
        for handler in consoles:
            handler.removeFilter(keep)
