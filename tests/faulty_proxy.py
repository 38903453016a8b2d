"""A real HTTP proxy on loopback that puts faults between boto3 and the S3 endpoint.

Of the requests it receives, a seeded fraction fail with a 5xx: half before reaching the endpoint (the
write never happened), half after (the write happened, its answer is lost), which is what makes a
retried conditional write meet its own first attempt. Of the GETs of objects (not listings) that succeed,
a seeded fraction ``cut_rate`` send their headers (with the full Content-Length) and half the body, then
drop the connection: the failure botocore's own retries do not cover. Requests whose path ends with ``hold_suffix``
are held unanswered until ``release`` (to interrupt a client in the middle of an upload).
The proxy stops when its ``with`` block ends, or by itself after ``lifetime_s``.
"""

from __future__ import annotations

import http.client
import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}
ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected by the test proxy</Message></Error>'
)


class FaultyProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        upstream: str,
        failure_rate: float = 0.2,
        seed: int = 0,
        hold_suffix: str | None = None,
        lifetime_s: float = 300,
        cut_rate: float = 0.0,
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        target = urlsplit(upstream)
        self.upstream = (target.hostname, target.port)
        self.failure_rate, self.hold_suffix, self.lifetime_s = failure_rate, hold_suffix, lifetime_s
        self.cut_rate = cut_rate
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.held, self.release = threading.Event(), threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def draw(self) -> str:
        """'before', 'after' (a 5xx) or 'ok' for the next request."""
        with self.lock:
            roll = self.random.random()
            fault = "ok" if roll >= self.failure_rate else ("before" if roll < self.failure_rate / 2 else "after")
            self.counts[fault] += 1
            return fault

    def draw_cut(self) -> bool:
        with self.lock:
            cut = self.random.random() < self.cut_rate
            self.counts["cut"] += cut
            return cut

    def __enter__(self) -> FaultyProxy:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        self._timer = threading.Timer(self.lifetime_s, self.shutdown)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._timer.cancel()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and 100-continue, as boto3 expects
    server: FaultyProxy

    def log_message(self, *args) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _fail(self, status: int, code: bytes) -> None:
        self._reply(status, [("Content-Type", "application/xml")], ERROR_BODY % code)

    def _forward(self) -> None:
        body = self._body()
        if self.server.hold_suffix and urlsplit(self.path).path.endswith(self.server.hold_suffix):
            self.server.held.set()
            self.server.release.wait(timeout=self.server.lifetime_s)
            self.close_connection = True
            return
        fault = self.server.draw()
        if fault == "before":
            return self._fail(503, b"SlowDown")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        connection = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
        finally:
            connection.close()
        if fault == "after":
            return self._fail(500, b"InternalError")
        keep = [(k, v) for k, v in response.getheaders() if k.lower() not in HOP_BY_HOP | {"content-length"}]
        if self.command == "HEAD" and response.getheader("Content-Length"):
            keep.append(("Content-Length", response.getheader("Content-Length")))
        if self._is_object_get() and response.status == 200 and len(answer) > 1 and self.server.draw_cut():
            return self._cut(keep, answer)
        self._reply(response.status, keep, answer)

    def _is_object_get(self) -> bool:
        # Path-style addressing: /<bucket>/<key>; a listing is /<bucket>/?list-type=2...
        return self.command == "GET" and len([p for p in urlsplit(self.path).path.split("/") if p]) >= 2

    def _cut(self, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(200)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.close_connection = True

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward
