"""Training next to a busy neighbour: what one busy-loop process on one core costs a train.py run.

Each round trains every preset alone and then next to a neighbour (a Python busy loop pinned to one
of the usable CPUs), for each OpenMP wait setting, and measures the run's wall time and CPU time
(user + system of the train.py process and its children). Prints, per preset and wait setting, the
medians and the two ratios the targets are stated in:

    slowdown  = wall next to the neighbour / wall alone          (half the cores: ~2x is fair)
    CPU ratio = CPU time next to the neighbour / CPU time alone  (> 1: threads burn cycles waiting)

Wait settings: ``passive`` is what train.py does unless told otherwise (OMP_WAIT_POLICY=PASSIVE, see
launch.py); ``spin`` is libgomp's own default (GOMP_SPINCOUNT=300000: a waiting thread spins first);
``short`` spins 30x less than that before sleeping (``--waits passive,short,spin`` to compare all three).
The "alone" columns show what each setting costs on a quiet machine.

    python benchmarks/busy_neighbour.py                               # vit_softmax, vit_linear; 2 epochs of digits
    python benchmarks/busy_neighbour.py --repeats 3 --csv busy.csv
    python benchmarks/busy_neighbour.py --epochs 1 --override data=synthetic --override data.num_train=64  # a quick try
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from train_run import train_once

WAITS = {
    "passive": {},
    "short": {"GOMP_SPINCOUNT": "10000"},  # env on top of one without any wait setting
    "spin": {"GOMP_SPINCOUNT": "300000"},
}
BUSY_LOOP = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def train(preset: str, wait: str, epochs: int, overrides, work: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one train.py run under the wait setting ``wait``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(WAITS[wait])
    run_dir = Path(tempfile.mkdtemp(dir=work)) / "run"
    wall, cpu, _ = train_once(
        [f"model={preset}", f"trainer.max_epochs={epochs}", "callbacks.export_best=null", *overrides], run_dir, env
    )
    return wall, cpu


class Neighbour:
    """A busy loop pinned to ``cpu`` while the ``with`` block runs."""

    def __init__(self, cpu: int):
        self.cpu, self.proc = cpu, None

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(self.cpu)])
        return self

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="vit_softmax,vit_linear")
    parser.add_argument("--waits", default="passive,spin", help=f"comma-separated, of {list(WAITS)}")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="rounds (alone, then next to the neighbour)")
    parser.add_argument("--override", action="append", default=[], help="any train.py override (repeatable)")
    parser.add_argument("--csv", type=Path, help="also write the table here")
    args = parser.parse_args()
    presets, waits = args.presets.split(","), args.waits.split(",")
    unknown = sorted(set(waits) - set(WAITS))
    if unknown:
        parser.error(f"unknown wait setting(s) {unknown}; choose from {list(WAITS)}")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs 2 or more usable CPUs: the neighbour takes one of them")
    print(
        f"{len(cpus)} CPUs, neighbour on CPU {cpus[-1]}; {args.epochs} epoch(s) per run, {args.repeats} round(s)",
        flush=True,
    )

    times = {(p, w, busy): [] for p in presets for w in waits for busy in (False, True)}
    with tempfile.TemporaryDirectory() as tmp:
        train(presets[0], waits[0], 1, args.override, Path(tmp))  # warm-up: page cache, kernel build
        for _ in range(args.repeats):
            for preset in presets:
                for wait in waits:
                    times[preset, wait, False].append(train(preset, wait, args.epochs, args.override, Path(tmp)))
                    with Neighbour(cpus[-1]):
                        times[preset, wait, True].append(train(preset, wait, args.epochs, args.override, Path(tmp)))

    header = ["preset", "wait", "alone wall s", "alone CPU s", "busy wall s", "busy CPU s", "slowdown", "CPU ratio"]
    rows = []
    for preset in presets:
        for wait in waits:
            alone, busy = (
                [statistics.median(x[i] for x in times[preset, wait, b]) for i in (0, 1)] for b in (False, True)
            )
            rows.append(
                [
                    preset,
                    wait,
                    f"{alone[0]:.1f}",
                    f"{alone[1]:.1f}",
                    f"{busy[0]:.1f}",
                    f"{busy[1]:.1f}",
                    f"{busy[0] / alone[0]:.2f}x",
                    f"{busy[1] / alone[1]:.2f}x",
                ]
            )
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print("targets: slowdown <= 2.1x, CPU ratio <= 1.3x")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            csv.writer(f).writerows([header, *rows])


if __name__ == "__main__":
    main()
