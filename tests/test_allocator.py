"""The glibc allocator setting of eval.py: freed activations are reused, not faulted in again."""

from __future__ import annotations

import sys

import pytest

from conftest import run_python

BLOCK_PAGES = (64 << 20) // 4096
# Allocate and free a 64 MiB tensor sixteen times; print the minor page faults of each of the last ten
# (the heap settles within the first rounds, not always in the first: six are left for it).
FAULTS = """
import resource, sys, torch
from vitzoo.runtime import retain_freed_memory
took = retain_freed_memory() if sys.argv[1] == "retain" else None
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 << 20)  # 64 MiB, freed at once
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(took, *faults[6:])
"""


def _faulting_rounds(mode: str):
    """(whether the setting took, how many of ten rounds faulted in more than half a block, the faults)."""
    out = run_python("-c", FAULTS, mode, check=True)
    took, *faults = out.stdout.split()
    return took, sum(int(f) > BLOCK_PAGES // 2 for f in faults), faults


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_retained_memory_is_reused_without_page_faults():
    took, retained, retained_faults = _faulting_rounds("retain")
    _, default, default_faults = _faulting_rounds("default")
    assert took == "True"
    assert default == 10, default_faults  # glibc's default: every 64 MiB block comes fresh from the OS
    assert retained <= 1, retained_faults  # retained: the freed block is reused
