"""torch's CPU threads sized from the CPUs this process may use (affinity mask, cgroup quota).

One OpenMP pool serves torch's ops, MKL (torch's wheels run MKL on the same GNU OpenMP) and the CPU
linear-attention kernel (at::parallel_for; its worker pool is sized from torch's thread count), so
sizing torch's threads sizes them all. train.py and eval.py also make the pool's threads wait
passively (launch.py, before torch loads).
"""
from __future__ import annotations

import logging
import os

import torch

from vitzoo.data.workers import usable_cpus

__all__ = ["size_thread_pools"]

log = logging.getLogger(__name__)


def size_thread_pools() -> int:
    """Set torch's intra-op threads to :func:`usable_cpus` (unless OMP_NUM_THREADS chose; a warning when
    that exceeds them); returns the thread count in use."""
    cpus = usable_cpus()
    if "OMP_NUM_THREADS" in os.environ:
        if torch.get_num_threads() > cpus:
            log.warning("OMP_NUM_THREADS=%s but this process may use %d CPU(s): threads will wait for each "
                        "other; unset it (threads then follow the usable CPUs)", os.environ["OMP_NUM_THREADS"], cpus)
    elif torch.get_num_threads() != cpus:
        torch.set_num_threads(cpus)
    return torch.get_num_threads()
