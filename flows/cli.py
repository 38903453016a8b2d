"""What the command lines share (``python -m flows.pipeline``, ``python -m flows.score``): a user's mistake is one
line on stderr and exit status 2, the full log (tracebacks included) goes to a file, and ``--debug`` shows the
traceback instead. ``image-classifier <command>`` (the console script, ``main`` here) reaches them all.

- ``CommandParser``: argparse whose errors are one line (no usage block; ``--help`` has it).
- ``FlowFlags``: a flow's command line from its signature and docstring: a flag per parameter, and
  ``add_model_flags``' group of flags per pydantic-model parameter (ModelSpec, TrainingParams, ConversionLimits),
  one per field, typed, with ``choices`` for the fields that take a fixed set of values.
- ``COMMANDS`` / ``main``: ``image-classifier train|score|registry …``, each the ``main(argv)`` of a module that
  also runs as ``python -m <module>``.
- ``run_command``: runs the flow; Prefect's console lines about a run that failed on a user's mistake (its
  task and flow run "Finished in state Failed" with the traceback) are kept off the console by a filter on
  Prefect's own console handler; the log file, and the Prefect API (the run's logs in the UI), still get them.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import inspect
import json
import logging
import os
import re
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from tasks.errors import PipelineInputError

T = TypeVar("T")
INPUT_ERRORS = (PipelineInputError, ValidationError)
logger = logging.getLogger("flows.cli")


class CommandParser(argparse.ArgumentParser):
    """An argparse parser whose error is one line: ``prog: error: ... (--help lists the flags)``."""

    def __init__(self, *args: Any, hint: str = "--help lists the flags", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.hint})\n")


def describe(error: BaseException) -> str:
    """A user's mistake as one line (a pydantic error: each bad field and why)."""
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or error.title}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
    return str(error)


def _flag_type(annotation: Any) -> tuple[Callable[[str], Any] | None, tuple | None]:
    """The argparse type and choices of a field's annotation (``int | None`` -> int; Literal -> its values)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if typing.get_origin(annotation) is Literal:
        return None, typing.get_args(annotation)
    if len(args) == 1 and typing.get_origin(args[0]) is Literal:
        return None, typing.get_args(args[0])
    if len(args) == 1 and args[0] in (int, float):
        return args[0], None
    return None, None  # str, or a union such as nodes' int | str: pydantic converts and checks it


def _one_of(choices: tuple) -> Callable[[str], str]:
    """An argparse type for a long list of names: a typo is told the closest names (difflib), not all of them."""

    def check(value: str) -> str:
        if value in choices:
            return value
        close = difflib.get_close_matches(value, choices, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise argparse.ArgumentTypeError(f"{value!r} is not one of the {len(choices)} choices{hint}")

    check.__name__ = "choice"
    return check


def add_model_flags(
    parser: argparse.ArgumentParser, model: type[BaseModel], skip: tuple[str, ...] = (), group: str | None = None
) -> list[str]:
    """One ``--flag`` per field of ``model`` (defaults None: the model's own apply; a field holding a model or a
    dict takes JSON); the fields added."""
    target = parser.add_argument_group(group) if group else parser
    added = []
    for name, field in model.model_fields.items():
        if name not in skip:
            default = field.get_default(call_default_factory=True)
            _add_flag(target, "--" + name.replace("_", "-"), name, field.annotation, field.description or "", default)
            added.append(name)
    return added


def summary(flow: Any) -> str:
    """A flow's docstring up to its Args: what a command's --help says it does."""
    return (flow.description or "").split("\n\n")[0]


class FlowFlags:
    """A flow's command line, from its signature: a positional argument per parameter without a default, a
    ``--flag`` per other parameter (help from the flow's docstring, as the UI's form shows it), and per parameter
    holding a pydantic model (ModelSpec, TrainingParams, ...) a group of flags, one per field. Flags left out pass
    nothing: the flow's and the models' own defaults apply. ``flags`` renames a parameter's flag; ``skip`` leaves
    parameters out, ``skip_fields`` fields of a model parameter."""

    def __init__(
        self,
        parser: argparse.ArgumentParser,
        flow: Any,
        *,
        skip: tuple[str, ...] = (),
        skip_fields: dict[str, tuple[str, ...]] | None = None,
        flags: dict[str, str] | None = None,
    ) -> None:
        self.flow, self.plain, self.models = flow, [], {}
        hints = typing.get_type_hints(flow.fn)
        described = flow.parameters.properties
        for name, parameter in inspect.signature(flow.fn).parameters.items():
            annotation = hints[name]
            if name in skip:
                continue
            if _is_model(annotation):
                group = f"{name} ({annotation.__name__})"
                self.models[name] = (
                    annotation,
                    add_model_flags(parser, annotation, (skip_fields or {}).get(name, ()), group),
                )
                continue
            description = described.get(name, {}).get("description", "")
            if parameter.default is inspect.Parameter.empty:
                parser.add_argument(name, help=" ".join(description.split()))
            else:
                flag = (flags or {}).get(name, "--" + name.replace("_", "-"))
                _add_flag(parser, flag, name, annotation, description, parameter.default)
            self.plain.append(name)

    def arguments(self, args: argparse.Namespace) -> dict[str, Any]:
        """The flow's keyword arguments from the parsed flags: those given, and each model parameter built from its
        fields' flags (may raise ValidationError)."""
        given = {name: getattr(args, name) for name in self.plain if getattr(args, name) is not None}
        for name, (model, fields) in self.models.items():
            given[name] = model_from_flags(model, args, fields)
        return given

    def with_defaults(self, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` and the flow's defaults for everything else: every parameter by name."""
        bound = inspect.signature(self.flow.fn).bind_partial(**given)
        bound.apply_defaults()
        return dict(bound.arguments)


def model_from_flags(model: type[T], args: argparse.Namespace, names: list[str], **extra: Any) -> T:
    """``model`` from the flags given (those left out take the model's defaults); may raise ValidationError."""
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    return model(**given, **extra)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _add_flag(target: Any, flag: str, name: str, annotation: Any, description: str, default: Any) -> None:
    """One ``--flag`` for a value of ``annotation``; its default None (left out: the model's or flow's own)."""
    kind, choices = _flag_type(annotation)
    shown = "" if default is None or isinstance(default, BaseModel) else f" (default: {default})"
    help = " ".join(description.split()) + shown
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if annotation in (bool, bool | None):
        target.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help)
    elif len(args) == 1 and (_is_model(args[0]) or typing.get_origin(args[0]) is dict or args[0] is dict):
        target.add_argument(flag, dest=name, type=json.loads, metavar="JSON", default=None, help=f"{help}; as JSON")
    elif choices and len(choices) > 12:  # many names (architectures): the closest first, not all of them
        target.add_argument(
            flag,
            dest=name,
            type=_one_of(choices),
            choices=choices,
            metavar=name.upper(),
            default=None,
            help=f"{help}; one of: {', '.join(choices)}",
        )
    else:
        target.add_argument(flag, dest=name, type=kind, choices=choices, default=None, help=help)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks (and Prefect's failure lines) on the console"
    )


def _input_error_names() -> set[str]:
    names, todo = {"ValidationError"}, [PipelineInputError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return names


class HideInputErrorFailures(logging.Filter):
    """Drops, from the console only, the records about a failure caused by a user's mistake: any record whose
    exception is one, and Prefect's task/flow run failure lines naming one. The one line the command prints says
    it; everything else (progress, warnings, failures of our own) still shows."""

    _NAMED = re.compile(r"\b([A-Z]\w*Error)\b")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], INPUT_ERRORS):
            return False
        if record.name.startswith(("prefect.flow_runs", "prefect.task_runs")) and (
            record.levelno >= logging.ERROR or "Finished in state Failed" in record.getMessage()
        ):
            return not set(self._NAMED.findall(record.getMessage())) & _input_error_names()
        return True


def log_file_for(work_dir: str, prog: str) -> Path:
    """``<work_dir>/logs/<prog>-<UTC time>-<pid>.log`` (with work_dir on S3: its copy in this host's cache)."""
    from tasks.workdir import local_folder

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(local_folder(work_dir)).resolve() / "logs" / f"{prog}-{stamp}-{os.getpid()}.log"


def run_command(call: Callable[[], T], *, log_file: Path, debug: bool) -> T:
    """Run ``call`` (a flow) with the log going to ``log_file``; a user's mistake: one line and exit 2."""
    import prefect  # noqa: F401  (sets up Prefect's logging, whose console handler gets the filter)

    from tasks.console import console_filter

    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    root = logging.getLogger()
    root.addHandler(to_file)
    # The filter stays on while the mistake itself is logged below (the file gets its traceback, the console not).
    with contextlib.nullcontext() if debug else console_filter(HideInputErrorFailures()):
        try:
            return call()
        except INPUT_ERRORS as error:
            logger.error("%s", describe(error), exc_info=True)
            if debug:
                raise
            print(f"error: {describe(error)} (full log: {log_file})", file=sys.stderr)
            raise SystemExit(2) from None
        finally:
            root.removeHandler(to_file)
            to_file.close()


def fail(error: BaseException, debug: bool) -> typing.NoReturn:
    """A mistake found before any run started: one line, exit 2 (``--debug``: the traceback)."""
    if debug:
        raise error
    print(f"error: {describe(error)}", file=sys.stderr)
    raise SystemExit(2)


# `image-classifier <command> ...`: the `main(argv)` of each module, which also runs as `python -m <module>`.
# A main that takes `prog` names itself after the command in its usage and errors.
COMMANDS = {
    "train": ("flows.pipeline", "train a classifier on folders of images and register it"),
    "score": ("flows.score", "score images with a registered model (evaluated when labeled)"),
    "registry": ("tasks.registry.__main__", "list, show, alias, tag, fetch … registered models"),
    "runs": ("flows.runs", "list the run folders, prune the old ones"),
}


def main(argv: list[str] | None = None) -> int:
    """The ``image-classifier`` console script: the first argument picks the command, the rest are its own."""
    argv = sys.argv[1:] if argv is None else argv
    parser = CommandParser(
        prog="image-classifier",
        description="Folders of images in, trained and registered classifiers out. Each command also runs as "
        "python -m flows.pipeline (train), flows.score (score), tasks.registry (registry) or flows.runs (runs).",
        hint="--help lists the commands",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, add_help=False)
    command = parser.parse_args(argv[:1]).command
    entry = importlib.import_module(COMMANDS[command][0]).main
    if "prog" in inspect.signature(entry).parameters:
        return entry(argv[1:], prog=f"{parser.prog} {command}")
    return entry(argv[1:])
