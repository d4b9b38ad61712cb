"""``python -m gpukit prepare --data TAR`` here; ``python3 -m gpukit run --out DIR [--rehearse]`` there;
``python -m gpukit merge ARCHIVE`` here again, with what came back."""

from __future__ import annotations

import argparse
from pathlib import Path

from .layout import ARCHIVE, BUDGET_S, KIT, REHEARSAL_BUDGET_S, ROOT, TIME_LIMIT_S


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m gpukit", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="fill the kit folder (wheels, data) on a machine with the registries")
    prep.add_argument("--data", required=True, help="the CIFAR-10 JPEG tar (cifar10-train-jpg.tar.gz)")
    prep.add_argument("--kit", type=Path, default=None, help=f"the kit folder (default: {KIT} in the repo root)")
    run = sub.add_parser("run", help="every phase under its time budget; summary.md + one archive into --out")
    run.add_argument("--out", required=True, help="folder for summary.md and the archive (on the GPU machine: $OUT)")
    run.add_argument(
        "--rehearse",
        action="store_true",
        help="on this CPU at tiny sizes, with this interpreter's packages (what CI runs)",
    )
    run.add_argument("--phases", default=None, help="comma list from tests,kernels,e2e,zoo (default: all)")
    run.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"seconds for the whole run (default {BUDGET_S}; rehearsal {REHEARSAL_BUDGET_S}); give the "
        f"command {TIME_LIMIT_S} s for the default",
    )
    run.add_argument(
        "--zoo-epochs",
        type=int,
        default=None,
        help="the zoo's epoch count, no probe (a second command matching the first one's, whose summary names it)",
    )
    run.add_argument("--zoo-presets", default=None, help="comma list of the zoo's presets (default: all)")
    merge = sub.add_parser("merge", help="a GPU run's archive into docs/benchmarks/attention_cuda.* and docs/zoo/gpu/")
    merge.add_argument("archive", type=Path, help=f"the {ARCHIVE} a run left in $OUT")
    merge.add_argument("--docs", type=Path, default=ROOT / "docs", help="the docs folder (default: the repo's)")
    args = p.parse_args(argv)
    if args.command == "run" and args.zoo_epochs is not None and args.zoo_epochs < 1:
        p.error(f"--zoo-epochs {args.zoo_epochs}: give a positive number of epochs (or leave it out for the probe)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "prepare":
        from .prepare import main as prepare

        prepare(args)
    elif args.command == "merge":
        from .merge import main as merge

        merge(args)
    else:
        from .run import main as run

        run(args)


if __name__ == "__main__":
    main()
