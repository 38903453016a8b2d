"""A progress line at least every ``PROGRESS_SECONDS`` while a long step runs (a download, a conversion), so a
person watching the console or the run's page sees it move. No Prefect import here: the training worker and the
plain functions use it too; inside a Prefect run the lines go to the run's logger (console and UI)."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Iterator

PROGRESS_SECONDS = 10.0


def run_logger(fallback: logging.Logger) -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run's logger when called in a task or flow run (its lines reach the console and the UI), else
    ``fallback``; this never imports Prefect itself."""
    if "prefect" in sys.modules:
        from prefect import get_run_logger
        from prefect.exceptions import MissingContextError

        try:
            return get_run_logger()
        except MissingContextError:
            pass
    return fallback


@contextlib.contextmanager
def every_while(
    line: Callable[[], str], log: logging.Logger | logging.LoggerAdapter, every: float | None = None
) -> Iterator[None]:
    """While the block runs, log ``line()`` at INFO every ``every`` seconds (default PROGRESS_SECONDS)."""
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_SECONDS if every is None else every):
            log.info("%s", line())

    reporter = threading.Thread(target=report, name="progress", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        done.set()
        reporter.join()
