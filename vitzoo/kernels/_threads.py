"""A pool of worker threads whose torch ops run single-threaded (intra-op threads = 1)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["single_threaded_pool"]

_lock = threading.Lock()
_pools: dict = {}


class _Pool:
    """``map(fn, items)`` on the workers, without autograd recording (grad and inference mode are
    per thread: the workers take the caller's inference mode and no_grad)."""

    def __init__(self, size: int):
        self.executor = ThreadPoolExecutor(size, thread_name_prefix="vitzoo-kernels")
        barrier, threads = threading.Barrier(size), torch.get_num_threads()

        def init(_):
            torch.set_num_threads(1)  # this thread's OpenMP / MKL threads ...
            torch.get_num_threads()  # ... fixed now (torch reads the process default lazily, once per thread)
            barrier.wait()  # every worker is a distinct thread, initialised before the default comes back

        list(self.executor.map(init, range(size)))
        torch.set_num_threads(threads)  # the process default for threads started later

    def map(self, fn, items):
        inference = torch.is_inference_mode_enabled()

        def run(item):
            if torch.get_num_threads() != 1:  # set_num_threads elsewhere in the process can reach the workers
                torch.set_num_threads(1)
            with torch.inference_mode() if inference else torch.no_grad():
                return fn(item)

        return list(self.executor.map(run, items))


def single_threaded_pool(size: int) -> _Pool:
    """The process's pool of ``size`` workers."""
    with _lock:
        if size not in _pools:
            _pools[size] = _Pool(size)
        return _pools[size]


def _forget_after_fork() -> None:
    """Threads do not survive fork (e.g. DataLoader workers): a child starts without pools."""
    global _lock
    _lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
