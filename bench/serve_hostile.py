"""Requests that hurt the endpoint (issue 61, part 3), sent to ``python -m tasks.serving`` on loopback with a bearer
token, as an attacker would: per request its status, its seconds, how far the server's memory rose (its peak
during the request over its RSS just before) and the longest a concurrent ``/healthz`` waited. Then 128 silent
clients, 15,000 random unauthenticated paths and each malformed inference request. Asserts nothing.

    python -m bench.serve_hostile                                   # the endpoint in this tree
    git worktree add /tmp/before <commit>
    python -m bench.serve_hostile --before /tmp/before              # that tree's endpoint beside this one's

The model: ResNet-18 at 32 px with random weights (``bench.score.random_model_directory``), 10 classes, served
from its folder with the endpoint's defaults (``--max-queue 128``, ``--max-body-mb 20``). ``/healthz`` is asked
every 20 ms from a thread of this process while each request is in flight (and once for 2 s with none, the
baseline). The peak: ``VmHWM`` of the server's process, reset (``/proc/<pid>/clear_refs``) before each request.
Writes ``bench/results/<date>-serve-hostile.json``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import io
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
from PIL import Image

from bench.harness import PROJECT_ROOT
from bench.score import random_model_directory
from deployments.local import free_port

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_BODY = 20 * 2**20
MAX_QUEUE = 128


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


class Endpoint:
    """One ``python -m tasks.serving`` process started from the source tree ``root``."""

    def __init__(self, root: Path, model_dir: Path, log: Path) -> None:
        self.port, self.log = free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "tasks.serving", str(model_dir), "--port", str(self.port)]
        env = {**os.environ, "IMAGE_CLASSIFIER_SERVE_TOKEN": TOKEN, "PYTHONPATH": str(root)}
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.process.poll() is None:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"the endpoint in {root} did not get ready:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def rss_mb(self) -> float:
        return status_kib(self.process.pid, "VmRSS") / 1024

    def reset_peak(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")

    def peak_mb(self) -> float:
        return status_kib(self.process.pid, "VmHWM") / 1024


class HealthWatch(threading.Thread):
    """``/healthz`` asked every 20 ms until stopped; the longest answer, in ms."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.longest, self._stopped = url, 0.0, threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stopped.is_set():
                started = time.perf_counter()
                client.get(f"{self.url}/healthz")
                self.longest = max(self.longest, (time.perf_counter() - started) * 1000)
                self._stopped.wait(0.02)

    def stop(self) -> float:
        self._stopped.set()
        self.join()
        return self.longest


def png() -> bytes:
    encoded = io.BytesIO()
    Image.new("RGB", (16, 16), (0, 128, 0)).save(encoded, format="PNG")
    return encoded.getvalue()


def oip_json(shape: list, data: list | str, **tensor) -> bytes:
    request = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": shape, "data": data, **tensor}]}
    return json.dumps(request, separators=(",", ":")).encode()


def oip_binary(elements: bytes, shape: list) -> tuple[bytes, dict]:
    tensor = {"name": "image", "datatype": "BYTES", "shape": shape, "parameters": {"binary_data_size": len(elements)}}
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + elements, {"Inference-Header-Content-Length": str(len(header))}


def just_under(piece: bytes, body: Callable[[int], bytes]) -> int:
    """How many ``piece``s ``body(count)`` holds without passing --max-body-mb."""
    return (MAX_BODY - len(body(0)) - 16) // len(piece)


def hostile_requests() -> dict[str, tuple[str, bytes, dict]]:
    """name -> (path, body, headers): each request of the issue's probes, and a few of the same kind."""
    infer = "/v2/models/model/infer"
    json_type = {"Content-Type": "application/json"}
    strings = just_under(b'"",', lambda n: oip_json([n], []))
    lists = just_under(b"[],", lambda n: oip_json([n], []))
    elements = just_under(struct.pack("<I", 0), lambda n: oip_binary(b"", [n])[0])
    image = png()
    boundary = "b"
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="i"; filename="i.png"\r\n\r\n'.encode() + b"\r\n"
    parts = just_under(part, lambda n: f"--{boundary}--\r\n".encode())
    encoded = base64.b64encode(os.urandom(MAX_BODY * 3 // 4 - 1000)).decode()
    noise = os.urandom(MAX_BODY)
    return {
        f"OIP JSON, {strings:,} empty strings": (infer, oip_json([strings], [""] * strings), json_type),
        f"OIP JSON, {lists:,} empty lists": (infer, oip_json([lists], [[]] * lists), json_type),
        f"OIP binary, {elements:,} empty elements": (infer, *oip_binary(b"\0" * 4 * elements, [elements])),
        "OIP JSON, 100,000 nested lists": (infer, b'{"inputs":' + b"[" * 100_000 + b"]" * 100_000 + b"}", json_type),
        f"OIP JSON, {MAX_QUEUE + 1} images (past --max-queue)": (
            infer,
            oip_json([MAX_QUEUE + 1], [base64.b64encode(image).decode()] * (MAX_QUEUE + 1)),
            json_type,
        ),
        f"multipart, {parts:,} parts": (
            "/v1/predict",
            part * parts + f"--{boundary}--\r\n".encode(),
            {"Content-Type": f"multipart/form-data; boundary={boundary}"},
        ),
        "OIP JSON, one 20 MB element (not an image)": (infer, oip_json([1], [encoded]), json_type),
        "raw body of 20 MB (not an image)": ("/v1/predict", noise, {"Content-Type": "image/jpeg"}),
        "multipart, one file of 20 MB (not an image)": (
            "/v1/predict",
            part.replace(b"\r\n\r\n", b"\r\n\r\n" + noise[: -2 * len(part)]) + f"--{boundary}--\r\n".encode(),
            {"Content-Type": f"multipart/form-data; boundary={boundary}"},
        ),
    }


def malformed() -> dict[str, tuple[bytes, dict]]:
    image = base64.b64encode(png()).decode()
    cases = {f"shape {shape}": oip_json(json.loads(shape), [image]) for shape in ('["1"]', "[null]", "[{}]")}
    cases["shape [1e999]"] = oip_json([1], [image]).replace(b"[1]", b"[1e999]")
    cases["shape [NaN]"] = oip_json([1], [image]).replace(b"[1]", b"[NaN]")
    cases["shape [-1,-1]"] = oip_json([-1, -1], [image])
    cases["tensor parameters [1]"] = oip_json([1], [image], parameters=[1])
    request = json.loads(oip_json([1], [image]))
    cases["request parameters 'x'"] = json.dumps({**request, "parameters": "x"}).encode()
    cases["outputs: 5"] = json.dumps({**request, "outputs": 5}).encode()
    cases["100,000 nested lists"] = oip_json([1], [image]).replace(b"[1]", b"[" * 100_000 + b"1" + b"]" * 100_000)
    found = {name: (body, {"Content-Type": "application/json"}) for name, body in cases.items()}
    found["empty binary tensor, shape [0]"] = oip_binary(b"", [0])
    return found


def one_request(endpoint: Endpoint, path: str, body: bytes, headers: dict) -> dict:
    time.sleep(0.5)  # the previous request's leftovers settle
    before = endpoint.rss_mb()
    endpoint.reset_peak()
    watch = HealthWatch(endpoint.url)
    watch.start()
    started = time.perf_counter()
    try:
        answer = httpx.post(endpoint.url + path, content=body, headers={**AUTH, **headers}, timeout=300)
        status, said = answer.status_code, answer.text[:160]
    except httpx.TransportError as error:
        status, said = 0, f"{type(error).__name__}: {error}"
    seconds = time.perf_counter() - started
    return {
        "status": status,
        "said": said,
        "seconds": round(seconds, 3),
        "rss_rise_mb": round(endpoint.peak_mb() - before, 1),
        "healthz_max_ms": round(watch.stop(), 1),
    }


def silent_clients(endpoint: Endpoint, count: int = 128) -> dict:
    """``count`` connections that send their headers (Content-Length: 1000) and then nothing; meanwhile a request
    with a photo, and /readyz; then how each silent one was answered within 15 s."""
    request = "POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 1000\r\n"
    silent = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", endpoint.port))
        connection.sendall(f"{request}Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        silent.append(connection)
    time.sleep(1)
    answer = httpx.post(
        f"{endpoint.url}/v1/predict", content=png(), headers={**AUTH, "Content-Type": "image/png"}, timeout=60
    )
    ready = httpx.get(f"{endpoint.url}/readyz", timeout=60)
    answered: dict[str, int] = {}
    deadline = time.monotonic() + 15
    for connection in silent:
        connection.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            first = connection.recv(64).split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
        except OSError:
            first = "no answer within 15 s"
        answered[first] = answered.get(first, 0) + 1
        connection.close()
    return {"a photo meanwhile": answer.status_code, "/readyz meanwhile": ready.status_code, "silent ones": answered}


def stranger_paths(endpoint: Endpoint, count: int) -> dict:
    def metrics() -> str:
        return httpx.get(f"{endpoint.url}/metrics", headers=AUTH, timeout=60).text

    before = metrics()
    with httpx.Client(base_url=endpoint.url, timeout=60) as client:
        statuses = {client.post(f"/{uuid.uuid4().hex}").status_code for _ in range(count)}
    after = metrics()
    series = [sum(1 for line in text.splitlines() if line and not line.startswith("#")) for text in (before, after)]
    return {"statuses": sorted(statuses), "series": series, "metrics_bytes": [len(before), len(after)]}


def measure(root: Path, model_dir: Path, scratch: Path, paths: int) -> dict:
    endpoint = Endpoint(root, model_dir, scratch / f"serve-{root.name}.log")
    try:
        watch = HealthWatch(endpoint.url)
        watch.start()
        time.sleep(2)
        found: dict = {"idle healthz_max_ms": round(watch.stop(), 1), "hostile": {}, "malformed": {}}
        for name, (path, body, headers) in hostile_requests().items():
            found["hostile"][name] = one_request(endpoint, path, body, headers)
            print(f"  {name}: {found['hostile'][name]}", flush=True)
        for name, (body, headers) in malformed().items():
            answer = httpx.post(
                f"{endpoint.url}/v2/models/model/infer", content=body, headers={**AUTH, **headers}, timeout=60
            )
            found["malformed"][name] = {"status": answer.status_code, "said": answer.text[:160]}
        found["silent clients"] = silent_clients(endpoint)
        found["stranger paths"] = stranger_paths(endpoint, paths)
        found["rss_end_mb"] = round(endpoint.rss_mb(), 1)
        return found
    finally:
        endpoint.stop()


def table(runs: dict[str, dict]) -> str:
    names = list(runs)
    lines = ["request | " + " | ".join(f"{n}: status, s, RSS rise MB, /healthz max ms" for n in names)]
    first = runs[names[0]]
    lines.append("(idle) | " + " | ".join(f"/healthz max {runs[n]['idle healthz_max_ms']} ms" for n in names))
    for request in first["hostile"]:
        cells = []
        for n in names:
            got = runs[n]["hostile"][request]
            cells.append(
                f"{got['status']}, {got['seconds']:.2f}, {got['rss_rise_mb']:+.0f}, {got['healthz_max_ms']:.0f}"
            )
        lines.append(f"{request} | " + " | ".join(cells))
    for request in first["malformed"]:
        lines.append(f"{request} | " + " | ".join(str(runs[n]["malformed"][request]["status"]) for n in names))
    for key in ("silent clients", "stranger paths"):
        lines.append(f"{key} | " + " | ".join(json.dumps(runs[n][key]) for n in names))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve_hostile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another source tree (a git worktree) measured beside this one")
    parser.add_argument("--only", choices=["before", "now"], help="measure one tree alone")
    parser.add_argument("--paths", type=int, default=15_000, help="random unauthenticated paths sent (15,000)")
    parser.add_argument("--output", type=Path, help="the results file (bench/results/<date>-serve-hostile.json)")
    args = parser.parse_args(argv)
    roots = {"before": args.before.resolve()} if args.before else {}
    roots["now"] = PROJECT_ROOT
    roots = {name: root for name, root in roots.items() if args.only in (None, name)}
    runs = {}
    with tempfile.TemporaryDirectory(prefix="serve-hostile-") as scratch:
        model_dir = random_model_directory(Path(scratch) / "model", "resnet18", [str(i) for i in range(10)], 32).root
        for name, root in roots.items():
            print(f"{name}: {root}", flush=True)
            runs[name] = measure(root, model_dir, Path(scratch), args.paths)
    print(table(runs))
    output = args.output or RESULTS / f"{datetime.date.today()}-serve-hostile.json"
    output.write_text(json.dumps(runs, indent=2) + "\n")
    print(f"written: {output}")


if __name__ == "__main__":
    main()
