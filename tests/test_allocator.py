"""The glibc allocator setting of train.py / eval.py: freed activations are reused, not faulted in again."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

# Allocate and free a 64 MiB tensor eleven times; print the minor page faults of the last nine rounds
# (the heap settles in the first two).
FAULTS = """
import resource, sys, torch
from vitzoo.training.allocator import retain_freed_memory
took = retain_freed_memory() if sys.argv[1] == "retain" else None
def round_():
    torch.ones(16 << 20)  # 64 MiB, freed at once
round_()
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(9):
    round_()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str):
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], cwd=ROOT, capture_output=True, text=True, check=True)
    took, faults = out.stdout.split()
    return took, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_retained_memory_is_reused_without_page_faults():
    pages = (64 << 20) // 4096
    took, retained = _faults("retain")
    _, default = _faults("default")
    assert took == "True"
    assert default > 9 * pages // 2  # glibc's default: every 64 MiB block comes fresh from the OS
    assert retained < pages // 10  # retained: the first block is reused, a few stray pages at most
