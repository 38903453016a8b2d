"""Prefect's console filtered for a while (flows/console.py)."""

import io
import logging

from flows.console import console_filter


def test_prefects_console_shows_only_what_the_filter_keeps_and_only_within_the_block():
    from prefect.logging.handlers import PrefectConsoleHandler

    shown = io.StringIO()
    console, kept = PrefectConsoleHandler(stream=shown), logging.StreamHandler(io.StringIO())
    root, logger = logging.getLogger(), logging.getLogger("tests.console")
    root.addHandler(console)
    root.addHandler(kept)
    logger.setLevel(logging.INFO)
    try:
        with console_filter(lambda record: "told in one line" not in record.getMessage()):
            logger.info("a failure told in one line")
            logger.info("training epoch 1")
        logger.info("after: told in one line again")
    finally:
        root.removeHandler(console)
        root.removeHandler(kept)
    assert "epoch 1" in shown.getvalue() and "after: told in one line again" in shown.getvalue()
    assert "a failure told in one line" not in shown.getvalue()
    assert "a failure told in one line" in kept.stream.getvalue(), "other handlers (a log file) get every record"
