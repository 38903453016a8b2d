"""The command lines' terminal: an argparse mistake in one line."""

import pytest

from tasks.console import CommandParser


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
