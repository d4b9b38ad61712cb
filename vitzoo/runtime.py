"""How a process sets itself up on its machine: the CPUs it may use, torch's thread pool sized from them,
and the C allocator told to keep freed memory.

torch's one OpenMP pool serves its ops, MKL (torch's wheels run MKL on the same GNU OpenMP) and the CPU
linear-attention kernel (at::parallel_for; its worker pool is sized from torch's thread count), so sizing
torch's threads sizes them all; train.py, eval.py and predict.py also make the pool's threads wait passively
(launch.py, before torch loads). DataLoader worker counts follow the same CPU count
(:func:`vitzoo.data.workers.resolve_num_workers`).

Keeping freed memory (eval.py's ``retain_freed_memory``): the CPU allocation setting eval.py starts with keeps
freed memory for reuse on glibc.

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
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Optional

import torch

__all__ = ["usable_cpus", "size_thread_pools", "retain_freed_memory", "cpu_model"]

log = logging.getLogger(__name__)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, glibc's malloc.h
_MMAP_THRESHOLD = 1 << 30  # blocks below 1 GiB come from the heap ...
_TRIM_THRESHOLD = (1 << 31) - 1  # ... and the heap top is not returned to the OS


def _cgroup_cpu_limit() -> Optional[float]:
    """CPUs allowed by a cgroup v2 quota (``cpu.max``), or None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota; at least 1."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        count = min(count, max(1, int(limit)))
    return max(1, count)


def size_thread_pools() -> int:
    """Set torch's intra-op threads to :func:`usable_cpus` (unless OMP_NUM_THREADS chose; a warning when
    that exceeds them); returns the thread count in use."""
    cpus = usable_cpus()
    if "OMP_NUM_THREADS" in os.environ:
        if torch.get_num_threads() > cpus:
            log.warning(
                "OMP_NUM_THREADS=%s but this process may use %d CPU(s): threads will wait for each "
                "other; unset it (threads then follow the usable CPUs)",
                os.environ["OMP_NUM_THREADS"],
                cpus,
            )
    elif torch.get_num_threads() != cpus:
        torch.set_num_threads(cpus)
    return torch.get_num_threads()


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


def cpu_model() -> str:
    """The CPU's model name as the OS reports it (Linux: /proc/cpuinfo's "model name", e.g. "AMD EPYC"), else the
    processor or machine type: what a benchmark names beside its times."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine() or "unknown CPU"
