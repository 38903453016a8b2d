"""A command stopped by Ctrl-C (SIGINT) or SIGTERM: one line, and exit status 128 + the signal's number (130, 143),
the shell's own for a process a signal ended (docs/failures.md, "Ctrl-C and SIGTERM").

A training stops every training process before the signal's exception leaves it (tasks/launch/interrupts.py);
Prefect sets the run Crashed on its way out. SIGINT needs nothing more: Python raises KeyboardInterrupt. SIGTERM
does: Prefect's own handler, which raises TerminationSignal inside a flow run, sends SIGTERM again once the run is
Crashed, to the handler it found, and Python's default would end the command there without a word."""

from __future__ import annotations

import contextlib
import logging
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

from prefect.exceptions import TerminationSignal

from flows.console import console_filter

STOPPED = (KeyboardInterrupt, TerminationSignal)


def _terminated(signum: int, frame: object) -> NoReturn:
    raise TerminationSignal(signal=signum)


# Prefect's words for a run that a signal ended (prefect.states.exception_to_crashed_state).
ABORTED = ("Execution was aborted by an interrupt signal", "Execution was aborted by a termination signal")


def _not_about_a_stop(record: logging.LogRecord) -> bool:
    """Off the console: Prefect's "Crash detected!" and "Finished in state Crashed" lines about the signal, and the
    command's own record of it with its traceback (the log file gets them all)."""
    if record.exc_info and isinstance(record.exc_info[1], STOPPED):
        return False
    return not (record.name.startswith("prefect.") and any(words in record.getMessage() for words in ABORTED))


@contextlib.contextmanager
def _sent_again_when_dropped() -> Iterator[None]:
    """A stop raised where Python can only drop it (a weakref callback or a ``__del__`` that a garbage collection ran:
    "Exception ignored in …") is not lost: its signal is sent to the main thread again, from a thread (sent from
    the hook, its handler would run inside the hook and be dropped there too). The launcher holds the signal while
    torchrun runs (tasks/launch/interrupts.py); this covers the stages around it."""
    dropped: queue.SimpleQueue[int | None] = queue.SimpleQueue()  # put() is safe inside a weakref callback
    leaving = threading.Event()

    def send_again() -> None:
        while (signum := dropped.get()) is not None and not leaving.is_set():
            signal.pthread_kill(threading.main_thread().ident, signum)

    def hook(unraisable: Any) -> None:
        stop = unraisable.exc_value
        if isinstance(stop, STOPPED):  # told in the command's one line, not as "Exception ignored in …"
            dropped.put(stop.signal if isinstance(stop, TerminationSignal) else signal.SIGINT)
        else:
            before(unraisable)

    sender = threading.Thread(target=send_again, name="stop-sent-again", daemon=True)
    sender.start()
    before = sys.unraisablehook
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = before
        leaving.set()  # a signal sent now would find the handlers of after the command
        dropped.put(None)
        sender.join()


@contextlib.contextmanager
def told_in_one_line(debug: bool) -> Iterator[None]:
    """Within the block, a stop is the command's one line (``stopped_by``): SIGTERM raises TerminationSignal, outside
    the flow run too (the temporary server's start), as SIGINT raises KeyboardInterrupt; neither is lost where Python
    drops exceptions; the records about it stay off the console (unless ``debug``). A SIGTERM ignored by whoever
    started the command stays ignored."""
    with contextlib.ExitStack() as stack:
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) not in (
            signal.SIG_IGN,
            None,
        ):
            previous = signal.signal(signal.SIGTERM, _terminated)
            stack.callback(signal.signal, signal.SIGTERM, previous)
        if not debug:
            stack.enter_context(console_filter(_not_about_a_stop))
        stack.enter_context(_sent_again_when_dropped())
        yield


def stopped_by(stop: BaseException) -> tuple[str, int]:
    """The line and the exit status of a command that ``stop`` (one of STOPPED) ended."""
    signum = stop.signal if isinstance(stop, TerminationSignal) else signal.SIGINT
    name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
    return f"stopped by {name}: its run, if it had started, is Crashed, and no training process is left", 128 + signum
