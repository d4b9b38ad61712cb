"""The process's memory as the kernel reports it (/proc/self/status), for the benchmarks' peak-memory columns."""

from __future__ import annotations

__all__ = ["status_mib"]


def status_mib(field: str) -> float:
    """``field`` of /proc/self/status (VmRSS: resident now, VmHWM: resident peak) in MiB; NaN where the file or the
    field does not exist (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":")), float("nan"))
    except OSError:
        return float("nan")
