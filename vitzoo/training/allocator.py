"""Keep freed memory for reuse on glibc: the CPU allocation setting eval.py starts with.

glibc serves every block above its mmap threshold (128 KiB, adapting up to 32 MiB) straight from
the OS and hands it back on free, so a model that allocates the same activations batch after batch
page-faults them in again every time: on a 2-core VM that cost a CIFAR ViT's batch-500 inference
about a third of its speed (a batch-128 training step showed no difference). Raising the mmap and
trim thresholds keeps freed blocks in the heap, as the jemalloc / tcmalloc setups of PyTorch's CPU
tuning guides do, at the price of the process keeping its peak heap.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["retain_freed_memory"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, glibc's malloc.h
_MMAP_THRESHOLD = 1 << 30  # blocks below 1 GiB come from the heap ...
_TRIM_THRESHOLD = (1 << 31) - 1  # ... and the heap top is not returned to the OS


def retain_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds so freed blocks are reused; True when it took effect
    (False and nothing changed on other platforms or C libraries)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt  # glibc only (not musl)
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
