"""``python -m vitzoo.kernels build``: compile the CPU linear-attention kernel now (about a minute, once per
install) instead of in the first linear-attention step on the CPU."""

from __future__ import annotations

import argparse
import sys

from .cpu_kernel import build_cpu_kernel


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitzoo.kernels", description=__doc__.split(":", 1)[1].strip())
    parser.add_argument("command", choices=["build"], help="build: compile (or find the cached) CPU kernel")
    parser.parse_args(argv)
    module = build_cpu_kernel()
    if module is None:  # the build's warning said why
        return 1
    print(f"vitzoo: the CPU linear-attention kernel is ready ({module.__file__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
