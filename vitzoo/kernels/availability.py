"""Whether the Triton path can run here: triton importable, or its CPU interpreter switched on. A leaf:
the package's entry and the Triton kernels both read it."""

from __future__ import annotations

import functools
import os

__all__ = ["triton_available", "triton_interpreting"]


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    """Whether ``triton`` imports (it need not find a GPU)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def triton_interpreting() -> bool:
    """Whether Triton runs kernels on its CPU interpreter (TRITON_INTERPRET=1, set before triton imports)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
