"""Heap settings for every `krill` process: reuse freed tensor memory instead of faulting in fresh pages.

Design decisions:
- glibc's malloc serves blocks above its mmap threshold with fresh mappings and gives freed
  memory at the top of the heap back to the system. A process that allocates and frees tensors of
  a few MiB every step (aggregation rows, gradients, optimizer temporaries) then pays a page fault
  per 4 KiB of every such tensor on every step. Measured on the default model, one torch thread:
  `krill train local` 321 -> 299 ms per step, TRL's GRPOTrainer 187 -> 207 steps per minute.
- At start-up (`krill.cli.main`, so every role process and benchmark) the mmap threshold goes to
  32 MiB, the largest glibc accepts, and the trim threshold to 256 MiB: blocks under 32 MiB come
  from the heap, and up to 256 MiB of freed heap stays mapped for the next step. A process's
  resident memory can stay that much above what it holds live.
- glibc only (Linux); elsewhere, or with KRILL_MALLOC_TUNING=0, nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 256 << 20


def tune_heap() -> bool:
    """Apply the thresholds above; True when glibc accepted both."""
    if os.environ.get("KRILL_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
