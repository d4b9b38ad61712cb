"""The process's memory as the kernel reports it (/proc/self/status), for the benchmarks' peak-memory columns."""

from __future__ import annotations

__all__ = ["status_mib", "timed_passes"]


def status_mib(field: str) -> float:
    """``field`` of /proc/self/status (VmRSS: resident now, VmHWM: resident peak) in MiB; NaN where the file or the
    field does not exist (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith(field + ":")), float("nan"))
    except OSError:
        return float("nan")


def timed_passes(run, reps: int):
    """(best seconds of ``reps`` calls of ``run``, peak resident MiB above the level before them): the peak
    (``VmHWM``) is reset through /proc/self/clear_refs first."""
    import time

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = status_mib("VmRSS")
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    return min(times), status_mib("VmHWM") - base, out
