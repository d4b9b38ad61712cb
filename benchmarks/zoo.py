"""The zoo benchmark: every mechanism trained with one recipe, then profiled, evaluated and tabulated.

    python benchmarks/zoo.py --budget cpu --data ../shared/data/cifar10-train-jpg.tar.gz
    python benchmarks/zoo.py --budget gpu --data /data/cifar10-jpg          # on a GPU machine
    python benchmarks/zoo.py --budget cpu --data ... --phases report         # re-tabulate only
    python benchmarks/zoo.py --budget cpu --data ... --presets vit_softmax,vit_linear \
        --work /tmp/zoo --out /tmp/zoo/report --override trainer.max_epochs=1   # a quick trial

Phases (``--phases``, default all, each skips what is already done, so a stopped run resumes):

* ``train``: ``train.py experiment=zoo_<budget> model=<preset> seed=<s>`` for every preset and seed
  (same data split, recipe and epochs; the budget adds the model size), one run dir each under
  ``--work``. A run with ``metrics.json`` is done; one with only ``last.ckpt`` is resumed.
* ``profile``: per run, in a fresh process: parameters, forward FLOPs per image (counted with
  ``torch.utils.flop_counter`` on the eager twins, so the attention matmuls are seen), training
  img/s (forward, backward, AdamW step on a batch of the recipe's size) and the peak resident
  memory of those steps above the process's baseline.
* ``eval``: one ``eval.py`` call over all final checkpoints (``last.ckpt``) with ``robustness=zoo``: clean
  accuracy, the 15 benchmark corruptions at severities 1-5, PGD L-inf 2/255, the attention-logit noise sweep, the
  resolution sweep. An eval whose recorded sweep is not the config's (an older harness) is run again.
* ``report``: one result file per finished run into ``--out``/per-run (see zoo_results.py), plus the files
  ``--merge`` names (other calls' or machines' runs); then ``results.md`` (table), ``results.csv`` and the plots
  into ``--out``, drawn from every result file in per-run/.

    python benchmarks/zoo.py --budget gpu --phases report --merge /elsewhere/zoo/per-run   # join another call's runs
    python benchmarks/zoo.py --budget pyramid --data ... --per-run --seeds 1   # only the second seeds

``--per-run`` takes each run through every phase (an eval.py call of its own, into its run dir) and writes its
result file before the next run starts: a call that is stopped (a GPU loan's time limit) keeps what it finished.

``--data`` is the CIFAR-10 JPEG tree (a folder holding ``train/<class>/*.jpg``) or its ``.tar.gz``,
unpacked once to ``~/.cache/vitzoo/``.

This file runs the phases; its siblings do the work: zoo_plan.py (presets, budgets, run dirs), zoo_profile.py,
zoo_results.py (the result files), zoo_table.py (results.md, results.csv), zoo_plots.py, zoo_data.py (``--data``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence, Set, Tuple

import zoo_plots
import zoo_results
import zoo_table
from zoo_data import resolve_data
from zoo_plan import BUDGETS, ROOT, Budget, Run, budget_rows, compose, plan, recipe_data
from zoo_profile import profile

PHASES = ("train", "profile", "eval", "report")


def run_logged(cmd: List[str], log: Path) -> None:
    """``cmd`` in the repo root, its output appended to ``log``; a failure exits naming the command and the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if code:
        raise SystemExit(f"failed ({code}): {' '.join(cmd)}\n  log: {log}")


def train(runs: List[Run], budget: Budget, data_root: Path, overrides: Sequence[str] = ()) -> None:
    for i, run in enumerate(runs, 1):
        if (run.dir / "metrics.json").is_file():
            print(f"[train {i}/{len(runs)}] {run.name}: done", flush=True)
            continue
        cmd = [
            sys.executable,
            "train.py",
            f"experiment={budget.experiment}",
            f"model={run.row.model}",
            f"seed={run.seed}",
            f"data.root={data_root}",
            f"hydra.run.dir={run.dir}",
            *run.row.overrides,
            *overrides,
        ]
        if run.last_ckpt.is_file():
            cmd.append(f"ckpt_path={run.last_ckpt}")
        print(f"[train {i}/{len(runs)}] {run.name} ...", flush=True)
        start = time.time()
        run_logged(cmd, run.dir / "harness.log")
        print(f"[train {i}/{len(runs)}] {run.name}: {time.time() - start:.0f} s", flush=True)


SWEEP_LISTS = ("corruptions", "severities", "logit_noise", "resolutions", "adversarial")  # what a zoo eval measures


def wanted_sweep(budget: Budget) -> dict:
    """The lists of the budget's robustness config (``configs/robustness/<name>.yaml`` over its defaults), numbers
    as floats, as eval.py would run them."""
    rob = compose("eval", [f"robustness={budget.robustness}"]).robustness
    return {k: _as_floats(rob[k]) for k in SWEEP_LISTS}


def _as_floats(values) -> list:
    return [v if isinstance(v, str) else float(v) for v in values]


def evaluate(runs: List[Run], budget: Budget, data_root: Path, work: Path) -> Path:
    """One eval.py call over every run's last.ckpt (labels ``<preset>_s<seed>``), into ``work/eval``; done where
    that folder holds an eval of these runs with the sweep the budget's config asks for."""
    out = work / "eval"
    ready = [r for r in runs if (r.dir / "metrics.json").is_file()]  # finished runs only
    if (out / "robustness.json").is_file():
        done = json.loads((out / "robustness.json").read_text())
        swept = {k: _as_floats(done["sweep"].get(k, [])) for k in SWEEP_LISTS}
        if set(done["checkpoints"]) == {r.eval_key for r in ready} and swept == wanted_sweep(budget):
            print("[eval] done", flush=True)
            return out
    if not ready:
        raise SystemExit("no trained runs to evaluate; run the train phase first")
    data = recipe_data(budget)
    data_overrides = [
        f"data.{k}={data[k]}"
        for k in ("img_size", "val_fraction", "split_seed", "eval_batch_size", "num_workers")
        if k in data
    ]
    ckpts = "{" + ",".join(f"{r.eval_key}:{r.last_ckpt}" for r in ready) + "}"
    cmd = [
        sys.executable,
        "eval.py",
        f"ckpt_path={ckpts}",
        "data=imagefolder",
        f"data.root={data_root}",
        *data_overrides,
        f"robustness={budget.robustness}",
        "robustness.progress=false",
        f"hydra.run.dir={out}",
    ]
    if budget.eval_images is not None:
        cmd.append(f"robustness.max_images={budget.eval_images}")
    print(f"[eval] {len(ready)} checkpoints ...", flush=True)
    start = time.time()
    shutil.rmtree(out, ignore_errors=True)
    run_logged(cmd, work / "eval.log")
    print(f"[eval] {time.time() - start:.0f} s", flush=True)
    return out


def collect(runs: List[Run], budget_name: str, budget: Budget, work: Path, overrides: Sequence[str]) -> List[tuple]:
    """(run dir, result file) of every trained run in this work dir, with its eval records where evaluated (by
    a ``--per-run`` call in the run dir, or by one call over the work dir)."""
    out = []
    for run in runs:
        if not (run.dir / "metrics.json").is_file():
            continue
        prof = json.loads((run.dir / "profile.json").read_text()) if (run.dir / "profile.json").is_file() else {}
        evals = (
            json.loads(p.read_text())
            for p in (run.dir / "eval" / "robustness.json", work / "eval" / "robustness.json")
            if p.is_file()
        )
        robustness = next((e for e in evals if run.eval_key in e["checkpoints"]), {})
        ckpt = robustness.get("checkpoints", {}).get(run.eval_key)
        records = (
            {
                "sweep": robustness["sweep"],
                "img_size": ckpt["img_size"],
                "protocol": ckpt.get("protocol"),
                "records": [r for r in robustness["records"] if r["checkpoint"] == run.eval_key],
            }
            if ckpt
            else None
        )
        out.append(
            (
                run.dir,
                zoo_results.build(
                    budget_name,
                    run.label,
                    run.preset,
                    run.seed,
                    budget.experiment,
                    overrides,
                    json.loads((run.dir / "metrics.json").read_text()),
                    prof,
                    records,
                ),
            )
        )
    return out


def report(
    results: List[dict], budget_name: str, budget: Budget, out: Path, command: str, checkpoints: Set[Tuple[str, int]]
) -> Path:
    """results.md + results.csv + plots into ``out``, from the result files of every run in ``out/per-run``;
    ``checkpoints``: the (preset, seed) whose checkpoint is in the work dir (what a cell not measured can say)."""
    if not results:
        raise SystemExit("nothing to report yet; run the train phase first, or --merge result files")
    results = sorted(results, key=zoo_table.order)
    out.mkdir(parents=True, exist_ok=True)
    zoo_table.write_csv(results, checkpoints, out / "results.csv")
    drawn = zoo_plots.draw(results, zoo_table.with_records(results), budget, out)
    zoo_table.write_markdown(results, budget_name, budget, command, checkpoints, drawn, out / "results.md")
    print(f"[report] {out / 'results.md'}", flush=True)
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--budget", choices=sorted(BUDGETS), default="cpu")
    p.add_argument("--data", type=Path, help="CIFAR-10 JPEG tree (folder with train/) or its .tar.gz")
    p.add_argument("--work", type=Path, default=None, help="run dirs (default: logs/zoo/<budget>)")
    p.add_argument("--out", type=Path, default=None, help="table and plots (default: docs/zoo/<budget>)")
    p.add_argument("--phases", default=",".join(PHASES), help="comma list from " + ",".join(PHASES))
    p.add_argument("--presets", default=None, help="comma list of presets (default: all)")
    p.add_argument(
        "--seeds",
        default=None,
        help="comma list of seeds (default: each preset's seeds in the budget); e.g. 1 to add the second seeds "
        "without training the first ones again on another machine",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override for every training run, after the budget's (repeatable); "
        "a run dir trained with other overrides is not retrained",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=[],
        metavar="PATH",
        help="report: result files, or folders of them (another call's <out>/per-run), to add to the "
        "table; a file of a run already there replaces it",
    )
    p.add_argument(
        "--per-run",
        action="store_true",
        help="each run through every phase (its own eval.py call) and into its result file before the "
        "next run starts, so a call that is stopped keeps every finished run (a GPU loan)",
    )
    p.add_argument("--batch-size", type=int, default=128, help="profile: training batch size")
    p.add_argument("--steps", type=int, default=10, help="profile: timed training steps")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    budget = BUDGETS[args.budget]
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"unknown phase(s) {unknown}; choose from {list(PHASES)}")
    if args.budget == "gpu" and {"train", "profile"} & set(phases):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(
                "the gpu budget trains and profiles on a CUDA GPU and torch sees none here; use "
                "--budget cpu, or --phases report --merge to join result files made on a GPU"
            )
    if args.merge and "report" not in phases:
        raise SystemExit("--merge joins result files in the report phase; add report to --phases")
    only = [p.strip() for p in args.presets.split(",") if p.strip()] if args.presets else None
    names = [row.preset for row in budget_rows(budget)]
    unknown = sorted(set(only or ()) - set(names))
    if unknown:
        raise SystemExit(f"unknown preset(s) {unknown} for the {args.budget} budget; choose from {', '.join(names)}")
    work = (args.work or ROOT / "logs" / "zoo" / args.budget).resolve()
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else None
    except ValueError:
        raise SystemExit(f"--seeds takes a comma list of integers (e.g. --seeds 1), not {args.seeds!r}") from None
    runs = plan(budget, work, only, seeds)
    if "train" in phases or "eval" in phases:
        if args.data is None:
            raise SystemExit("--data is required for the train and eval phases")
        data_root = resolve_data(args.data)
    out = (args.out or ROOT / "docs" / "zoo" / args.budget).resolve()
    merge = args.merge
    # --per-run: each run through every phase (its eval in its own dir) and into its result file before the next
    for group, eval_work in [([run], run.dir) for run in runs] if args.per_run else [(runs, work)]:
        if "train" in phases:
            train(group, budget, data_root, args.override)
        if "profile" in phases:
            profile(group, args.batch_size, args.steps)
        if "eval" in phases:
            evaluate(group, budget, data_root, eval_work)
        if "report" in phases:
            per_run = out / "per-run"
            lines = zoo_results.add(collect(group, args.budget, budget, work, args.override), per_run, args.budget)
            lines += zoo_results.merge(merge, per_run, args.budget) if merge else []
            merge = []  # once
            for line in lines:
                print(f"[report] {line}", flush=True)
            command = f"python benchmarks/zoo.py --budget {args.budget} --phases report"
            checkpoints = {(run.preset, run.seed) for run in runs if run.last_ckpt.is_file()}
            report(zoo_results.load_all(per_run, args.budget), args.budget, budget, out, command, checkpoints)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
