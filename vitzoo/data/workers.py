"""DataLoader worker counts sized from the CPUs this process may use (:func:`vitzoo.runtime.usable_cpus`)."""

from __future__ import annotations

import logging
from typing import Union

from vitzoo.runtime import usable_cpus

__all__ = ["resolve_num_workers"]

log = logging.getLogger(__name__)


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
        log.warning(
            "num_workers=%d but this process may use %d CPU(s); set num_workers=auto (= %d)",
            workers,
            cpus,
            min(8, cpus - 1),
        )
    return workers
