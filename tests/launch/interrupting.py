"""What the interrupt tests share (tests/launch/test_interrupts.py, tests/flows/test_signals.py): a signal that comes
while Python runs a weakref callback, and a proxy that holds one request to the Prefect server unanswered."""

from __future__ import annotations

import asyncio
import signal
import threading
import weakref
from urllib.parse import urlsplit


def signal_in_a_weakref_callback(sig: int) -> None:
    """``sig`` comes while a weakref callback runs (as one did while matplotlib drew the training curves), where
    Python prints "Exception ignored in …" and drops whatever the signal's handler raises."""

    class Freed:
        pass

    thing = Freed()
    reference = weakref.ref(thing, lambda _: signal.raise_signal(sig))
    del thing
    assert reference() is None


class HoldingProxy:
    """Bytes pass both ways untouched (keep-alive connections and the events websocket alike), except the first
    request that starts with the bytes given to ``arm``: it is not sent on until ``release``. ``held`` is set once it
    came. ``url`` stands for the server's API URL."""

    def __init__(self, api_url: str) -> None:
        target = urlsplit(api_url)
        self.upstream, self.path = (target.hostname, target.port), target.path
        self.held, self._released = threading.Event(), threading.Event()
        self._hold: bytes | None = None
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._connect, "127.0.0.1", 0))
        threading.Thread(target=self.loop.run_forever, name="holding-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}{self.path}"

    def arm(self, request_start: bytes) -> None:
        self.held.clear()
        self._released.clear()
        self._hold = request_start

    def release(self) -> None:
        self._hold = None
        self._released.set()

    def close(self) -> None:
        self.release()
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)

    async def _connect(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        try:
            server, to_server = await asyncio.open_connection(*self.upstream)
        except OSError:
            to_client.close()
            return
        await asyncio.gather(self._pipe(client, to_server, requests=True), self._pipe(server, to_client))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, requests: bool = False) -> None:
        try:
            while data := await reader.read(1 << 16):
                # A request's first bytes start a read: the client waits for each answer before it sends the next.
                if requests and self._hold and data.startswith(self._hold) and not self.held.is_set():
                    self.held.set()
                    await asyncio.to_thread(self._released.wait)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
