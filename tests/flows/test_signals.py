"""A command stopped by a signal (flows/signals.py), in this process; the command line itself, stopped while it
trains: tests/launch/test_interrupts.py."""

from __future__ import annotations

import signal
import time

import pytest
from prefect.exceptions import TerminationSignal

from flows.signals import stopped_by, told_in_one_line
from tests.launch.interrupting import signal_in_a_weakref_callback


@pytest.fixture
def handlers():
    """SIGINT as Python sets it (a test process may start with it ignored), Prefect's SIGTERM bridge as a flow run
    has it; both put back after."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig, raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, TerminationSignal)])
def test_a_signal_dropped_in_a_weakref_callback_is_sent_again(handlers, sig, raised):
    """Without the command, Python drops it there (tests/launch/test_interrupts.py shows it for SIGINT)."""
    went_on = []
    with pytest.raises(raised), told_in_one_line(debug=True):
        signal_in_a_weakref_callback(sig)
        went_on.append("past the callback")
        for _ in range(600):  # the signal sent again ends this loop (a blocking call could miss a signal sent just
            time.sleep(0.1)  # before it blocks, as any could: no sleep here lasts long)
        went_on.append("waited")
    assert went_on == ["past the callback"]


def test_the_line_and_the_status_name_the_signal():
    assert stopped_by(KeyboardInterrupt()) == (
        "stopped by Ctrl-C (SIGINT): its run, if it had started, is Crashed, and no training process is left",
        130,
    )
    assert stopped_by(TerminationSignal(signal.SIGTERM))[1] == 143
    assert stopped_by(TerminationSignal(signal.SIGTERM))[0].startswith("stopped by SIGTERM: ")
