"""Keep freed memory for reuse: glibc's allocator settings for processes that run a network batch after batch.

By default glibc serves every block above 128 KiB with a fresh ``mmap`` and hands it back to the kernel on
``free``, so each batch page-faults its activations in afresh. Raising both thresholds keeps freed blocks in the
heap for the next batch: more training steps and scored images per second with the same peak memory
(bench/step.py; BENCHMARKS.md). The trim threshold alone is worse than the default: both are set, or neither.

A subprocess gets them through its environment (glibc reads ``MALLOC_*_`` at start); a process that is
already running sets them with ``mallopt``. Settings the user chose are left alone. Other C libraries
(musl, macOS) ignore both.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from collections.abc import Mapping

MMAP_THRESHOLD = 256 * 2**20  # blocks below this come from the heap and are reused after free
TRIM_THRESHOLD = 2**30  # free memory at the top of the heap kept before returning it to the kernel
ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_applied = False


def user_chose_allocator(environ: Mapping[str, str]) -> bool:
    return any(name in environ for name in ENVIRONMENT) or "GLIBC_TUNABLES" in environ


def allocator_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` plus the settings, for a subprocess, unless the user set any allocator option."""
    return dict(environ) if user_chose_allocator(environ) else {**environ, **ENVIRONMENT}


def _glibc() -> ctypes.CDLL | None:
    if platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def keep_freed_memory() -> bool:
    """Apply the settings to this process (once; glibc only). Returns whether they are in effect."""
    global _applied
    if _applied or user_chose_allocator(os.environ) or (libc := _glibc()) is None:
        return _applied
    _applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _applied


def release_free_memory() -> None:
    """Hand the free pages inside every heap back to the kernel (glibc's ``malloc_trim``; a no-op elsewhere).

    Conversion calls it every few thousand images: its threads each read, decode and hash one small image after
    another, and with a heap (arena) each the free holes between what lives on grew the process by about 5 KB
    every 100 images (100,000 tiny PNGs, 4 threads), never handed back, since glibc returns only a heap's top.
    """
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)
