"""Run every benchmark, print one table, and write bench/results/<date>-<host>.json (what `make bench` does).

    python -m bench.run                  # everything, about 30 minutes on 2 CPU cores (fanout: 10, transfer: 12)
    python -m bench.run convert score    # some of them

Each figure is measured side by side in this one run (alternating repetitions, median); nothing is compared
with numbers from another day.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import socket
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from bench.harness import table

BENCHMARKS = ("convert", "score", "train", "step", "pipeline", "fanout", "gpu", "transforms", "transfer")
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(BENCHMARKS), help=f"any of {', '.join(BENCHMARKS)}")
    names = parser.parse_args().names
    figures, seconds = [], {}
    for name in names:
        started = time.monotonic()
        figures += importlib.import_module(f"bench.{name}").figures()
        seconds[name] = round(time.monotonic() - started, 1)
        print(f"[{name}: {seconds[name]} s]", flush=True)
    print(table(figures))
    now = datetime.now(timezone.utc)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{now:%Y-%m-%d}-{socket.gethostname()}.json"
    record = {
        "date": now.isoformat(),
        "machine": machine(),
        "seconds": seconds,
        "figures": [f.as_dict() for f in figures],
    }
    path.write_text(json.dumps(record, indent=2))
    print(f"written {path}")


if __name__ == "__main__":
    main()
