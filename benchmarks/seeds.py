"""The README's main job across seeds: final and best val accuracy, wall and CPU time per run, and the
spread (mean, sample std, min-max) per preset, with the versions it ran on.

Runs are sequential (each has the machine to itself); their directories and console logs stay under
``--work``, and a finished run (metrics.json present) is not run again, so an interrupted sweep resumes.

    python benchmarks/seeds.py                                          # vit_linear + vit_softmax, seeds 0-4
    python benchmarks/seeds.py --presets vit_linear --seeds 42,0,1 --work /tmp/seeds
    python benchmarks/seeds.py --override trainer.max_epochs=1 --work /tmp/try        # a quick try
"""

from __future__ import annotations

import argparse
import json
import statistics
from importlib.metadata import version
from pathlib import Path

from train_run import ROOT, train_once


def spread(values) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.2f} +- {100 * std:.2f} ({100 * min(values):.2f}-{100 * max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="vit_linear,vit_softmax")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--work", type=Path, default=ROOT / "logs" / "seeds")
    parser.add_argument("--override", action="append", default=[], help="any train.py override (repeatable)")
    args = parser.parse_args()
    print("versions: " + ", ".join(f"{p} {version(p)}" for p in ("torch", "timm", "lightning", "numpy")), flush=True)
    results = {}
    for preset in args.presets.split(","):
        for seed in args.seeds.split(","):
            run = args.work / f"{preset}_seed{seed}"
            timing = run / "timing.json"
            if not timing.is_file():
                wall, cpu, _ = train_once([f"model={preset}", f"seed={seed}", *args.override], run)
                timing.write_text(json.dumps({"wall_s": wall, "cpu_s": cpu}))
            metrics, cost = json.loads((run / "metrics.json").read_text()), json.loads(timing.read_text())
            results[preset, seed] = (metrics["val/acc1"], metrics["best_score"], cost["wall_s"], cost["cpu_s"])
            print(
                f"{preset:<12} seed {seed:<4} val/acc1 final {100 * results[preset, seed][0]:.2f}%  best "
                f"{100 * results[preset, seed][1]:.2f}%  wall {cost['wall_s'] / 60:.1f} min  "
                f"CPU {cost['cpu_s'] / 60:.1f} min",
                flush=True,
            )
    for preset in args.presets.split(","):
        rows = [v for (p, _), v in results.items() if p == preset]
        print(
            f"{preset}: final {spread([r[0] for r in rows])}%, best {spread([r[1] for r in rows])}%, "
            f"wall {statistics.median(r[2] for r in rows) / 60:.1f} min, "
            f"CPU {statistics.median(r[3] for r in rows) / 60:.1f} min (medians), {len(rows)} seeds"
        )


if __name__ == "__main__":
    main()
