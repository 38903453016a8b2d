"""Ctrl-C (SIGINT) and SIGTERM while torchrun runs belong to the launcher (``StopOnSignal``), so that one signal
always stops a training, whatever the launcher's main thread is doing when it comes.

Python raises a signal's exception (KeyboardInterrupt for SIGINT; Prefect's TerminationSignal for SIGTERM inside a
flow run) at whatever Python line the main thread is running. When that line belongs to a weakref callback or a
``__del__`` that a garbage collection started, CPython reports the exception as "Exception ignored in …" and
drops it: the signal is lost, the run stays Running and torchrun trains on. The per-epoch publishing (matplotlib
drawing the curves, Prefect's client) frees many such objects: one SIGINT of 100 sent into it was lost so, in
``WeakKeyDictionary``'s callback (docs/failures.md).

So, while a training runs, the handler only records the signal and wakes a thread that stops every training
process at once (``stop``: SIGTERM to torchrun, SIGKILL for what is left); the launcher's poll loop ends at its next
look, and on leaving, the signal is raised again from the launcher's own line, to the handler that was there before
(Python's KeyboardInterrupt, Prefect's TerminationSignal: the run ends Crashed; no handler: the signal's default
action). Another signal meanwhile is recorded once only; the stop takes at most ``stop_training``'s grace.

Python runs a handler only in the main thread, between two of its bytecodes: while the main thread is inside a C call
that does not return on a signal (one that retries its wait by itself, or a signal the kernel handed to another
thread), the handler waits with it. So the thread is also woken through ``signal.set_wakeup_fd``: the C-level handler
writes the signal's number there at once, from whichever thread took it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """``with StopOnSignal(stop) as signalled:`` … ``signalled.received`` is the first signal that came (or None).

    Handlers are installed from the main thread only (Python allows no other), and not over a signal that is
    ignored (a command started in the background with SIGINT ignored keeps ignoring it) or whose handler Python
    cannot put back (one installed by C code)."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self.stop = stop
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._woken = threading.Event()
        self._leaving = False
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._previous_fd = -1
        self._stopper = threading.Thread(target=self._stop_when_woken, name="stop-on-signal", daemon=True)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                    self._previous[sig] = signal.signal(sig, self._record)
            if self._previous:
                self._wakeup = socket.socketpair()
                for end in self._wakeup:
                    end.setblocking(False)
                self._previous_fd = signal.set_wakeup_fd(self._wakeup[1].fileno(), warn_on_full_buffer=False)
        self._stopper.start()
        return self

    def _record(self, signum: int, frame: FrameType | None) -> None:
        # No exception here: raised on whatever line the main thread is at, it could be dropped.
        if self.received is None:
            self.received = signum
            self._woken.set()

    def _woken_by_the_kernel(self) -> None:
        """Until leaving: the numbers the C-level handler writes, passed on to a wakeup fd that was there before."""
        reader = self._wakeup[0]
        while not self._leaving and not self._woken.is_set():
            select.select([reader], [], [])
            with contextlib.suppress(BlockingIOError):
                numbers = reader.recv(64)
                if self._previous_fd != -1:
                    with contextlib.suppress(OSError):
                        os.write(self._previous_fd, numbers)
                ours = [number for number in numbers if number in self._previous]
                if ours and not self._leaving:
                    self._record(ours[0], None)

    def _stop_when_woken(self) -> None:
        if self._wakeup is not None:
            self._woken_by_the_kernel()
        self._woken.wait()
        if self.received is not None:
            self.stop()

    def __exit__(self, *exc_info: object) -> None:
        try:
            # Handlers first: a signal recorded before this is stopped for by the thread below, one after it goes
            # to the earlier handler.
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            if self._wakeup is not None:
                signal.set_wakeup_fd(self._previous_fd)
        finally:
            self._leaving = True
            self._woken.set()
            if self._wakeup is not None:
                self._wakeup[1].send(b"\0")  # 0 is no signal's number: it only wakes the thread
            self._stopper.join()
            for end in self._wakeup or ():
                end.close()
        if self.received is not None:
            signal.raise_signal(self.received)
