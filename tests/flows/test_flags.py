"""A flow's command line from its signature and docstring: a flag per parameter, a group per model parameter,
typed, with its choices; what is left out takes the flow's and the models' defaults."""

from typing import Literal

import pytest
from prefect import flow

from flows.flags import FlowFlags, summary
from tasks.console import CommandParser
from tasks.contracts.conversion_limits import ConversionLimits

Colour = Literal["red", "orange", "yellow", "green", "blue", "indigo", "violet", "cyan", "magenta", "white", "grey", "black", "brown"]  # fmt: skip


@flow(name="demo")
def demo(
    images: str,
    epochs: int = 5,
    device: Literal["cpu", "cuda"] = "cpu",
    colour: Colour = "red",
    verbose: bool = False,
    conversion: ConversionLimits = ConversionLimits(),
    extra: dict | None = None,
) -> None:
    """Label the images.

    Args:
        images: Folder of images to label.
        epochs: Passes over the data.
        device: Where to run.
        colour: A colour.
        verbose: Say more.
        conversion: Limits of the conversion.
        extra: Anything else, as JSON.
    """


def parsed(*argv: str) -> tuple[FlowFlags, dict]:
    parser = CommandParser(prog="demo")
    flags = FlowFlags(parser, demo)
    return flags, flags.arguments(parser.parse_args(list(argv)))


def test_the_flags_given_become_the_flows_typed_arguments_and_the_rest_its_defaults():
    flags, given = parsed("photos", "--epochs", "3", "--max-image-pixels", "100", "--verbose", "--extra", '{"seed": 1}')
    assert given == {
        "images": "photos",
        "epochs": 3,
        "verbose": True,
        "extra": {"seed": 1},
        "conversion": ConversionLimits(max_image_pixels=100),
    }
    assert flags.with_defaults(given) == {**given, "device": "cpu", "colour": "red"}


@pytest.mark.parametrize(
    ("argv", "told"),
    [
        (["photos", "--epochs", "three"], "argument --epochs: invalid int value: 'three'"),
        (["photos", "--device", "gpu"], "argument --device: invalid choice: 'gpu' (choose from"),
        (["photos", "--colour", "gren"], "'gren' is not one of the 13 choices (did you mean green, grey"),
        ([], "the following arguments are required: images"),
    ],
)
def test_a_wrong_flag_is_one_line_naming_it(argv, told, capsys):
    with pytest.raises(SystemExit):
        parsed(*argv)
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and told in error, error


def test_help_says_what_the_flow_and_each_flag_do_with_their_defaults():
    parser = CommandParser(prog="demo", description=summary(demo))
    FlowFlags(parser, demo)
    shown = " ".join(parser.format_help().split())
    assert "Label the images." in shown and "Args:" not in shown
    assert "--epochs EPOCHS Passes over the data. (default: 5)" in shown
    assert "conversion (ConversionLimits):" in shown and "--max-image-pixels" in shown
