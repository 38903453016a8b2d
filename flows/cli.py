"""What the command lines share (``python -m flows.pipeline``, ``python -m flows.score``): a user's mistake is one
line on stderr and exit status 2, the full log (tracebacks included) goes to a file, and ``--debug`` shows the
traceback instead. ``image-classifier <command>`` (the console script, ``main`` here) reaches them all.

- ``CommandParser`` (from tasks/console.py): argparse whose errors are one line (no usage block; ``--help`` has it).
- ``run_flow``: a flow's whole command line: its flags (``flows.flags.FlowFlags``: generated from the flow's
  signature and docstring and from its pydantic-model parameters' fields), a check before any work, the run.
- ``check_prefect_api``: the server PREFECT_API_URL names answers, and lets this client in, before any work; with
  none named, the temporary server the command starts can have its database (flows/temporary_server.py).
- ``COMMANDS`` / ``main``: ``image-classifier train|score|registry …``, each the ``main(argv)`` of a module that
  also runs as ``python -m <module>``.
- ``run_command``: starts the temporary server (its output in the log file) and runs the flow. A run that fails
  at runtime (a ``RunFailedError``: a training, a shard, a sweep, the storage) is one line naming the flow run and
  the log, exit status 1; any other exception is our bug and keeps its traceback. Prefect's console lines about
  a failure told in one line (its task and flow run "Finished in state Failed" with the traceback) are kept off the
  console by a filter on Prefect's own console handler; the log file, and the Prefect API (the run's logs in the
  UI), still get them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import logging
import os
import re
import sys
import time
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flows import temporary_server
from tasks.console import CommandParser
from tasks.errors import PipelineInputError, PrefectServerUnavailableError, RunFailedError

INPUT_ERRORS = (PipelineInputError, ValidationError)
TOLD_IN_ONE_LINE = (RunFailedError, *INPUT_ERRORS)
logger = logging.getLogger("flows.cli")
# Prefect warns at import when it cannot make PREFECT_HOME; the temporary server's check says so in one line
# (``image-classifier`` imports this module before Prefect).
warnings.filterwarnings("ignore", message="Failed to create the Prefect home directory", category=UserWarning)


def describe(error: BaseException) -> str:
    """A user's mistake as one line (a pydantic error: each bad field and why)."""
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or error.title}: {e['msg'].removeprefix('Value error, ')}"
            for e in error.errors()
        )
    return str(error)


def add_debug_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks (and Prefect's failure lines) on the console"
    )


def _told_error_names() -> set[str]:
    names, todo = {"ValidationError"}, [PipelineInputError, RunFailedError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo += cls.__subclasses__()
    return names


class HideFailuresToldInOneLine(logging.Filter):
    """Drops, from the console only, the records about a failure that the command tells in one line (a user's
    mistake, a run that failed): any record whose exception is one, and Prefect's task/flow run failure lines naming
    one; and the temporary server's start. Everything else (progress, warnings, failures of our own) still shows."""

    _NAMED = re.compile(r"\b([A-Z]\w*Error)\b")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], TOLD_IN_ONE_LINE):
            return False
        if record.getMessage().startswith(temporary_server.STARTS):
            return False  # "Starting temporary server on …": the log file has it
        if record.name.startswith(("prefect.flow_runs", "prefect.task_runs")) and (
            record.levelno >= logging.ERROR or "Finished in state Failed" in record.getMessage()
        ):
            return not set(self._NAMED.findall(record.getMessage())) & _told_error_names()
        return True


def log_file_for(work_dir: str, prog: str) -> Path:
    """``<work_dir>/logs/<prog>-<UTC time>-<pid>.log`` (with work_dir on S3: its copy in this host's cache)."""
    from tasks.storage.work_dir_on_s3 import local_folder

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path(local_folder(work_dir)).resolve() / "logs" / f"{prog}-{stamp}-{os.getpid()}.log"


def run_command(flow: Any, arguments: dict[str, Any], *, log_file: Path, debug: bool) -> Any:
    """Run ``flow`` with ``arguments``, the log going to ``log_file`` (a temporary server's output too): a user's
    mistake is one line and exit 2, a run that failed one line naming the run and exit 1."""
    import prefect  # noqa: F401  (sets up Prefect's logging, whose console handler gets the filter)

    from flows.console import console_filter
    from flows.signals import STOPPED, stopped_by, told_in_one_line

    log_file.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(log_file, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    root = logging.getLogger()
    root.addHandler(to_file)
    state = None
    # The filter stays on while the failure itself is logged below (the file gets its traceback, the console not).
    with contextlib.nullcontext() if debug else console_filter(HideFailuresToldInOneLine()), told_in_one_line(debug):
        try:
            temporary_server.start(log_file)
            with on_a_lasting_server():
                state = flow(**arguments, return_state=True)
            return state.result()
        except (*TOLD_IN_ONE_LINE, *STOPPED) as error:
            if isinstance(error, STOPPED):
                line, status = stopped_by(error)
            elif isinstance(error, RunFailedError) and state is not None:
                line, status = f"run {flow_run_name(state)} failed: {str(error).strip().splitlines()[0]}", 1
            else:
                line, status = describe(error), 2
            logger.error("%s", line, exc_info=True)
            if debug:
                raise
            print(f"error: {line} (full log: {log_file})", file=sys.stderr)
            raise SystemExit(status) from None
        finally:
            root.removeHandler(to_file)
            to_file.close()


def on_a_lasting_server() -> contextlib.AbstractContextManager:
    """With PREFECT_API_URL set, this command's own run beats as the deployments' runs do and carries the tag the
    lost-host automation watches (the run of a killed command is set Crashed: docs/operations.md), and its requests
    and events ride out a server restart (tasks/outages); a setting the environment gives wins (a slower beat: no
    tag)."""
    from prefect import settings, tags
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tasks.outages import RIDE_OUT_SERVER_RESTART, RUN_HEARTBEAT_S, heartbeat_tag
    from tasks.outages.prefect_events import events_wait_for_the_server

    if not PREFECT_API_URL.value():  # a temporary server: it stops with the command
        return contextlib.nullcontext()
    wanted = {**RIDE_OUT_SERVER_RESTART, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(RUN_HEARTBEAT_S)}
    stack = contextlib.ExitStack()
    stack.enter_context(events_wait_for_the_server())
    stack.enter_context(temporary_settings({getattr(settings, k): v for k, v in wanted.items() if k not in os.environ}))
    if int(os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", RUN_HEARTBEAT_S)) <= RUN_HEARTBEAT_S:
        stack.enter_context(tags(heartbeat_tag(RUN_HEARTBEAT_S)))
    return stack


def flow_run_name(state: Any) -> str:
    """The name of the flow run that ended in ``state``, quoted (its id when the server cannot say)."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    run_id = state.state_details.flow_run_id
    try:
        with get_client(sync_client=True) as client:
            return repr(client.read_flow_run(run_id).name)
    except (httpx.HTTPError, ObjectNotFound):
        return str(run_id)


def checks(flow: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Marks a check of ``flow``'s arguments: its parameters keyword-only, each the flow's with its annotation, else a
    TypeError at import (not a KeyError in a user's run). ``run_flow`` gives it the arguments it names."""
    takes = [f"{name}: {parameter.annotation}" for name, parameter in inspect.signature(flow.fn).parameters.items()]

    def mark(check: Callable[..., None]) -> Callable[..., None]:
        named = [(f"{p.name}: {p.annotation}", p.kind) for p in inspect.signature(check).parameters.values()]
        if wrong := [text for text, kind in named if kind != inspect.Parameter.KEYWORD_ONLY or text not in takes]:
            told = f"not keyword-only parameters of {flow.name}, which takes {', '.join(takes)}"
            raise TypeError(f"{check.__qualname__} checks {', '.join(wrong)}: {told}")
        return check

    return mark


def run_flow(
    flow: Any,
    argv: list[str] | None,
    *,
    prog: str,
    check: Callable[..., None],
    log_name: str,
    **flags: Any,
) -> Any:
    """Parse ``argv`` into ``flow``'s arguments (``flags``: FlowFlags' options), ``check`` (``checks(flow)``) those
    it names before any work, and run the flow with its log in ``<work_dir>/logs/<log_name>-<time>-<pid>.log``;
    a user's mistake at either step is one line and exit 2."""
    from flows.flags import FlowFlags, summary

    parser = CommandParser(prog=prog, description=summary(flow))
    flow_flags = FlowFlags(parser, flow, **flags)
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    try:
        given = flow_flags.arguments(args)
        arguments = flow_flags.with_defaults(given)
        check_prefect_api()
        check(**{name: arguments[name] for name in inspect.signature(check).parameters})
    except INPUT_ERRORS as error:
        fail(error, args.debug)
    return run_command(flow, given, log_file=log_file_for(arguments["work_dir"], log_name), debug=args.debug)


def check_prefect_api(required: bool = False) -> None:
    """The Prefect server that PREFECT_API_URL names answers (its version), with this client's credentials; else
    ``PrefectServerUnavailableError`` saying what to do. With no PREFECT_API_URL a flow runs on a temporary server
    of its own, whose database is checked (flows/temporary_server.py), unless ``required`` (deployments need a
    server that stays)."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        if required:
            raise PrefectServerUnavailableError(
                "PREFECT_API_URL is not set: deployments and workers need a Prefect server that keeps running "
                "(`make server` in another shell; `make deploy`, `make worker` and `make serve` set PREFECT_API_URL "
                "to it)"
            )
        temporary_server.check_database()
        return
    import httpx
    from prefect.client.orchestration import get_client

    # The version, not /health: Prefect's basic auth lets /health through without credentials.
    try:
        with get_client(sync_client=True) as client:
            client.api_version()
        return
    except httpx.HTTPStatusError as error:
        status, problem = error.response.status_code, error
    except httpx.HTTPError as error:  # no answer at all
        status, problem = None, error
    if status in (401, 403):
        raise PrefectServerUnavailableError(
            f"the Prefect server at {url} asks for credentials (HTTP {status}): run the command through "
            "`python -m deployments.auth client -- …`, which reads them from ~/.config/image-classifier/prefect-auth, "
            "or set PREFECT_API_AUTH_STRING (docs/operations.md)"
        )
    if status is not None:
        raise PrefectServerUnavailableError(
            f"{url} answered HTTP {status} when asked for its Prefect version: PREFECT_API_URL must be a Prefect server's "
            "API, which ends in /api (e.g. http://127.0.0.1:4200/api)"
        )
    otherwise = "" if required else ", or unset PREFECT_API_URL to run on a temporary server of this command's own"
    raise PrefectServerUnavailableError(
        f"no Prefect server answers at {url} (PREFECT_API_URL): {problem or type(problem).__name__}. Start it "
        f"(`make server`){otherwise}"
    )


def server_command(
    prog: str,
    doc: str | None,
    argv: list[str] | None,
    flags: Callable[[argparse.ArgumentParser], object] | None = None,
) -> argparse.Namespace:
    """The command line of a command that works on a running Prefect server (``make deploy``, ``make serve``,
    ``make worker``): the flags ``flags`` adds (none by default), ``--help`` (its module's ``doc``) and
    ``--debug``; the server is checked before anything starts."""
    parser = CommandParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if flags:
        flags(parser)
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    try:
        check_prefect_api(required=True)
    except PrefectServerUnavailableError as error:
        fail(error, args.debug)
    return args


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
    "registry": ("flows.registry", "list, show, alias, tag, fetch … registered models"),
    "runs": ("flows.runs", "list the run folders, prune the old ones"),
    "predict": ("flows.predict", "label a few photos with a trained model, at once (no server)"),
    "sweep": ("flows.sweep", "sweep hyperparameters over the gpu pool and register the best trial"),
    "serve": ("tasks.serving.__main__", "answer HTTP requests with a registered model, batched, following its alias"),
    "monitor": ("flows.monitor", "measure the served model's drift: its recorded answers against its reference"),
    "label-queue": ("tasks.monitoring.label_queue", "export the recorded images the model was least sure of, to label"),
}


def main(argv: list[str] | None = None) -> int:
    """The ``image-classifier`` console script: the first argument picks the command, the rest are its own."""
    argv = sys.argv[1:] if argv is None else argv
    parser = CommandParser(
        prog="image-classifier",
        description="Folders of images in, trained and registered classifiers out. Each command also runs as "
        "python -m flows.pipeline (train), flows.score (score), flows.registry (registry), flows.runs (runs) or "
        "flows.predict (predict), tasks.serving (serve).",
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


if __name__ == "__main__":
    raise SystemExit(main())
