"""The events client that waits for the server to come back instead of dropping the events it had to send.

A run's task runs reach the server's record only as events its process sends (Prefect 3 writes no task run
through the API), over a websocket opened when the process sends its first event. Prefect's client tries to open it
11 times, for about 8 s; when the server is down all that while, the process's events service stops and drops
what it held, and the run ends Completed with task runs the server never heard of (a shard started just before a
20 s restart: tests/flows/test_score_shards.py; 3 of 100 runs in bench/load.py's restart round). Once the socket is
open, Prefect's own client keeps what the server has not confirmed and sends it again when it reconnects. Here the
client tries ``RECONNECTION_ATTEMPTS`` times (1 s apart after the first three), to open the socket or to send an
event, before it gives up.

The price: a process that ends while the server stays down waits that long for each event it still holds before it
exits. Prefect's own client type, with its own option: Prefect sends events only through the client types it knows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

RECONNECTION_ATTEMPTS = 120  # about 2 minutes


@contextlib.contextmanager
def events_wait_for_the_server() -> Iterator[None]:
    """Within it, this process's events service (created on its first event) tries ``RECONNECTION_ATTEMPTS`` times;
    only for a lasting server (PREFECT_API_URL set): a temporary one starts and stops with the process."""
    from prefect.events.clients import PrefectEventsClient
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        yield
        return
    EventsWorker.set_client_override(PrefectEventsClient, reconnection_attempts=RECONNECTION_ATTEMPTS)
    try:
        yield
    finally:
        EventsWorker.set_client_override(None)
