"""The command lines' terminal: an argparse mistake in one line, and Prefect's console filtered for a while."""

import io
import logging

import pytest

from tasks.console import CommandParser, console_filter


def test_a_command_line_mistake_is_one_line_with_a_hint_and_exit_status_2(capsys):
    parser = CommandParser(prog="image-classifier serve")
    parser.add_argument("--port", type=int)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--port", "eighty"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "image-classifier serve: error: argument --port: invalid int value: 'eighty' (--help lists the flags)\n"
    )
    with pytest.raises(SystemExit):
        CommandParser(prog="runs", hint="runs --help lists them").parse_args(["--nope"])
    assert capsys.readouterr().err == "runs: error: unrecognized arguments: --nope (runs --help lists them)\n"


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
