"""How many CPUs this process may use, and DataLoader worker counts sized from them."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional, Union

__all__ = ["usable_cpus", "resolve_num_workers"]

log = logging.getLogger(__name__)


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


def resolve_num_workers(value: Union[int, str, None]) -> int:
    """``auto``/None -> one worker per usable CPU beyond the main process (0 on one CPU), capped at 8;
    an int is kept, with a warning when it exceeds the usable CPUs (workers would wait for each other)."""
    cpus = usable_cpus()
    if value is None or value == "auto":
        return min(8, cpus - 1)
    try:
        workers = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"num_workers must be an integer >= 0 or 'auto', got {value!r}") from None
    if workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0 or 'auto', got {workers}")
    if workers > cpus:
        log.warning("num_workers=%d but this process may use %d CPU(s); set num_workers=auto (= %d)",
                    workers, cpus, min(8, cpus - 1))
    return workers
