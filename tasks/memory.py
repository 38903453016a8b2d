"""A process's peak memory, as its own.

``getrusage``'s ``ru_maxrss`` survives ``exec`` and starts a child at its parent's size (a worker forked from a
1.8 GB benchmark process reported 1.8 GB); Linux's VmHWM starts afresh with each program.
"""

from __future__ import annotations

import platform
import resource
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB since it started its program (Linux: VmHWM)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if platform.system() == "Darwin" else peak / 1024  # bytes on macOS, KiB elsewhere
