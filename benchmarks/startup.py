"""Start-up: how long train.py takes to answer ``--help`` and a configuration error, next to a bare
``import torch`` (the floor any PyTorch program pays), measured in one run.

Commands alternate round by round (A B C A B C ...) so machine noise hits all alike; the table shows
the median wall time and its ratio to ``import torch``. ``--compare DIR`` times the same commands in
another checkout as well (e.g. the commit before a change: ``git archive <commit> | tar -x -C DIR``), so
before and after sit side by side.

    python benchmarks/startup.py                       # 7 rounds
    mkdir /tmp/before && git archive <commit> | tar -x -C /tmp/before
    python benchmarks/startup.py --compare /tmp/before --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {  # label -> arguments to the interpreter, run in the checkout
    "import torch": ["-c", "import torch"],
    "train.py --help": ["train.py", "--help"],
    "train.py model=no_such_model": ["train.py", "model=no_such_model"],
    "eval.py --help": ["eval.py", "--help"],
}


def wall(args, cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare", type=Path, help="another checkout to time the same commands in")
    args = parser.parse_args()
    checkouts = {"this checkout": ROOT}
    if args.compare is not None:
        checkouts[f"{args.compare}"] = args.compare.resolve()
    cases = [
        (name, label)
        for name in checkouts
        for label in COMMANDS
        if not (label == "import torch" and name != "this checkout")
    ]  # the floor is the same interpreter
    times = {case: [] for case in cases}
    for case in cases:
        wall(COMMANDS[case[1]], checkouts[case[0]])  # warm-up: page cache, .pyc files
    for _ in range(args.rounds):
        for case in cases:
            times[case].append(wall(COMMANDS[case[1]], checkouts[case[0]]))

    floor = statistics.median(times["this checkout", "import torch"])
    print(f"python {sys.version.split()[0]}, {args.rounds} rounds; median wall s (ratio to import torch)")
    for name, label in cases:
        median = statistics.median(times[name, label])
        print(f"{name:<30} {label:<30} {median:6.2f} s  {median / floor:5.2f}x")
    print("target: --help and a config error within 1.6x of import torch")


if __name__ == "__main__":
    main()
