"""``image-classifier serve MODEL``: a trained model answering HTTP requests, batched, following its alias.

    image-classifier serve digits-resnet18@production                 # http://127.0.0.1:8080, follows the alias
    image-classifier serve digits-resnet18/3 --max-batch-size 32 --max-wait-ms 5
    image-classifier serve runs/<run>/model --port 9000                # a ModelDirectory
    image-classifier serve digits-resnet18@production --canary digits-resnet18/4 --canary-percent 10
    image-classifier serve digits-resnet18@production --record records --record-images low-confidence
    curl -H 'Content-Type: image/jpeg' --data-binary @photo.jpg http://127.0.0.1:8080/v1/predict

MODEL is a registry reference (``name``, ``name/3``, ``name@production``; ``--registry``, a folder or s3://…) or a
ModelDirectory. With ``name@alias`` the registry is read every ``--poll-s`` seconds and a new version swapped in
when the alias moves. On an address other than loopback a bearer token is required: IMAGE_CLASSIFIER_SERVE_TOKEN,
or the 0600 file ``--token-file`` (``~/.config/image-classifier/serve-token``, created with a random token when
missing). ``--ssl-certfile`` and ``--ssl-keyfile`` serve HTTPS. On SIGTERM, ``/readyz`` turns 503, requests in flight are answered (``--drain-s`` at most), then it exits.
A mistake (an unknown model, a bad option, a port in use) is one line on stderr and exit status 2. docs/serving.md
has the API, the settings and sizing.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import sys
from dataclasses import fields, replace
from pathlib import Path

from tasks.console import CommandParser
from tasks.serving.settings import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_PORT, ServeSettings
from tasks.storage.secrets import SecretFileError, config_dir, create_secret, is_loopback, read_secret

TOKEN_VARIABLE = "IMAGE_CLASSIFIER_SERVE_TOKEN"
TOKEN_FILE = "serve-token"


def parse(argv: list[str] | None, prog: str) -> tuple[ServeSettings, Path | None]:
    parser = CommandParser(
        prog=prog, description=__doc__.replace("``", ""), formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "model", metavar="MODEL", help="a registry reference (name, name/3, name@alias) or a ModelDirectory"
    )
    parser.add_argument("--registry", default="registry", help="where MODEL resolves: a folder or s3://… (registry)")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (127.0.0.1; 0.0.0.0: every one)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port ({DEFAULT_PORT})")
    parser.add_argument(
        "--runtime", choices=["torch", "onnx"], default="torch", help="torch, or onnxruntime on model.onnx"
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16", "int8"],
        default="fp32",
        help="fp32; bf16 (a GPU's autocast); int8 (ONNX Runtime's quantized model on the CPU, made once)",
    )
    parser.add_argument("--calibration", metavar="DIR", help="int8 the first time: the validation images")
    parser.add_argument("--device", default="auto", help="auto (cuda when there is one), cpu, cuda, cuda:1 …")
    parser.add_argument("--max-batch-size", type=int, default=16, help="images per forward pass (16)")
    parser.add_argument(
        "--max-wait-ms", type=float, default=10.0, help="the longest a batch waits for requests still arriving (10 ms)"
    )
    parser.add_argument(
        "--max-queue", type=int, default=128, help="images admitted at once; full: 503, more in one request: 413 (128)"
    )
    parser.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20, help="largest body (20)")
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help=f"a body not received within this is answered 408 ({DEFAULT_BODY_TIMEOUT_S:g} s)",
    )
    parser.add_argument("--max-image-pixels", type=int, default=ServeSettings.max_image_pixels, help="(50,000,000)")
    parser.add_argument("--poll-s", type=float, default=5.0, help="how often a followed alias is read (5 s)")
    parser.add_argument(
        "--canary", metavar="REFERENCE", help="a second version (name/7) for --canary-percent of requests"
    )
    parser.add_argument("--canary-percent", type=float, default=10.0, help="the canary's share of requests (10)")
    parser.add_argument("--drain-s", type=float, default=30.0, help="on SIGTERM, the longest wait for requests (30 s)")
    parser.add_argument(
        "--decode-threads", type=int, default=0, help="threads decoding a batch's images (0: the network's own thread)"
    )
    parser.add_argument(
        "--token-file", type=Path, help=f"the bearer token's 0600 file (~/.config/image-classifier/{TOKEN_FILE})"
    )
    parser.add_argument("--ssl-certfile", metavar="PEM", help="TLS: the certificate (chain), with --ssl-keyfile")
    parser.add_argument("--ssl-keyfile", metavar="PEM", help="TLS: the certificate's private key")
    parser.add_argument(
        "--record",
        metavar="DIR",
        help="record what is answered into DIR or s3://… (off by default; docs/monitoring.md)",
    )
    parser.add_argument("--record-sample", type=float, default=1.0, help="share of answered images recorded (1.0)")
    parser.add_argument(
        "--record-images",
        choices=["none", "low-confidence", "all"],
        default="none",
        help="whose bytes are kept with their record (none: predictions and image properties only)",
    )
    parser.add_argument(
        "--record-max-gb", type=float, help="a local record folder's bound: the oldest segments go first"
    )
    parser.add_argument(
        "--record-segment-s",
        type=float,
        default=60.0,
        help="records are published once the oldest waiting is this old, or 1,000 wait (60 s)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    for flag, value, least in (
        ("--max-batch-size", args.max_batch_size, 1),
        ("--max-queue", args.max_queue, 1),
        ("--decode-threads", args.decode_threads, 0),
        ("--max-image-pixels", args.max_image_pixels, 1),
        ("--max-wait-ms", args.max_wait_ms, 0),
        ("--drain-s", args.drain_s, 0),
    ):
        if value < least:
            parser.error(f"{flag} {value}: give {least} or more")
    if args.max_body_mb <= 0 or args.poll_s <= 0 or args.body_timeout_s <= 0:
        parser.error("--max-body-mb, --body-timeout-s and --poll-s must be more than 0")
    if not 0 < args.canary_percent < 100:
        parser.error(f"--canary-percent {args.canary_percent}: give a share between 0 and 100")
    if bool(args.ssl_certfile) != bool(args.ssl_keyfile):
        parser.error("give --ssl-certfile and --ssl-keyfile together")
    for flag, path in (("--ssl-certfile", args.ssl_certfile), ("--ssl-keyfile", args.ssl_keyfile)):
        if path and not Path(path).is_file():
            parser.error(f"{flag} {path}: no such file")
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port}: give 1 to 65535")
    if not 0 < args.record_sample <= 1:
        parser.error(f"--record-sample {args.record_sample}: give a share above 0, at most 1")
    if args.record_max_gb is not None and args.record_max_gb <= 0:
        parser.error(f"--record-max-gb {args.record_max_gb}: give more than 0")
    if args.record_segment_s <= 0:
        parser.error(f"--record-segment-s {args.record_segment_s}: give more than 0")
    if args.record and not args.record.startswith("s3://"):
        problem = unwritable(Path(args.record))
        if problem:
            parser.error(f"--record {args.record}: {problem}")
    converted = {
        "max_body_bytes": int(args.max_body_mb * 2**20),
        "canary_percent": args.canary_percent if args.canary else 0.0,
        "record_max_bytes": int(args.record_max_gb * 2**30) if args.record_max_gb else None,
    }
    named = ({f.name for f in fields(ServeSettings)} & vars(args).keys()) - converted.keys()  # flag = setting
    settings = ServeSettings(**{name: getattr(args, name) for name in named}, **converted)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return settings, args.token_file


def unwritable(folder: Path) -> str | None:
    """Why records cannot be written into ``folder`` (None: they can); it is made when missing."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"cannot be made: {error.strerror}"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "is not writable by this user"
    return None


def bearer_token(settings: ServeSettings, token_file: Path | None) -> str | None:
    """The token requests must carry: IMAGE_CLASSIFIER_SERVE_TOKEN, else ``--token-file``. Off loopback one is
    required: the default file's, created with a random token when missing (the Prefect server's rule,
    deployments/auth.py). On loopback with neither given: None, an open endpoint."""
    token = os.environ.get(TOKEN_VARIABLE) or (read_secret(token_file) if token_file else None)
    if token is not None:
        return token
    if token_file is not None:
        raise SecretFileError(f"--token-file {token_file} does not exist: write a token in it (mode 0600)")
    if is_loopback(settings.host):
        return None
    token_file = config_dir() / TOKEN_FILE
    token = read_secret(token_file)
    if token is not None:
        return token
    token = create_secret(token_file, secrets.token_urlsafe(32))
    print(
        f"bearer token: created {token_file} (mode 0600); clients send 'Authorization: Bearer <its text>'",
        file=sys.stderr,
    )
    return token


def check_port(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (None: it can)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return f"cannot listen on {host}:{port}: {error.strerror} (another server there? give --port)"
    return None


def main(argv: list[str] | None = None, prog: str = "python -m tasks.serving") -> int:
    settings, token_file = parse(argv, prog)
    try:
        settings = replace(settings, token=bearer_token(settings, token_file))
    except (SecretFileError, OSError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    busy = check_port(settings.host, settings.port)
    if busy:
        print(f"{prog}: error: {busy}", file=sys.stderr)
        return 2
    from tasks.serving.server import serve  # torch, FastAPI and uvicorn: once the options are known to be good

    return serve(settings, prog)


if __name__ == "__main__":
    sys.exit(main())
