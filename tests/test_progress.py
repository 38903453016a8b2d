"""A progress line at a steady pace while a long step runs, none after it; outside a Prefect run, the caller's
logger."""

import logging
import threading
import time

from tasks.progress import every_while, run_logger


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_long_step_logs_its_progress_line_while_it_runs_and_stops_with_it():
    log, lines = logging.getLogger("tests.progress"), Lines()
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    done = []
    try:
        with every_while(lambda: f"{len(done)} of 3 done", log, every=0.05):
            for _ in range(3):
                time.sleep(0.2)
                done.append(1)
        after = len(lines.lines)
        time.sleep(0.2)
    finally:
        log.removeHandler(lines)
    assert after >= 2 and len(lines.lines) == after, "lines while it ran, none after"
    counts = [int(line.removesuffix(" of 3 done")) for line in lines.lines]
    assert counts == sorted(counts) and counts[0] < 3, "each line says how far it got then"
    assert not [t for t in threading.enumerate() if t.name == "progress"], "the reporter thread ended"


def test_outside_a_run_the_progress_goes_to_the_callers_logger():
    fallback = logging.getLogger("tests.progress")
    assert run_logger(fallback) is fallback
