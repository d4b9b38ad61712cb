"""Phase d of a kit run: the GPU zoo through benchmarks/zoo.py, sized to the time that is left.

A probe trains the first preset for one epoch; its epoch line's img/s and the time around it (start-up, data)
set the epoch count E so that every preset fits the rest of the budget, trained by WORKERS zoo.py calls side by
side on the GPU (each assumed to get 1/WORKERS of the probe's rate). With E = 1 the probe's run is the preset's
zoo run; otherwise it is retrained. Each run's result file, the table and the plots come from one report call
over the runs that finished; stopped runs have no result file.
"""

from __future__ import annotations

import csv
import math
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List

from .layout import ROOT
from .phases import Context, Outcome

WORKERS = 4
TRAIN_IMAGES = 45_000  # CIFAR-10's 50,000 less the recipe's 10% val split
MAX_EPOCHS = 50  # configs/experiment/zoo_gpu.yaml's
REPORT_S, REHEARSAL_REPORT_S = 25, 15  # kept for the report call
# rehearsal: the cpu budget (the gpu one refuses a machine without CUDA), a single-seed preset (its probe run is its
# zoo run: no worker starts), a tiny model
REHEARSAL_PRESETS = ("vit_efficient",)
TINY = [
    "data.batch_size=8",
    "data.eval_batch_size=16",
    "data.num_workers=0",
    "++model.kwargs.depth=1",
    "++model.kwargs.embed_dim=32",
    "++model.kwargs.num_heads=2",
]


def recipe_of(e: int) -> List[str]:
    """Overrides for ``e`` epochs with the recipe's warm-up share (5 of 50 epochs)."""
    return [f"trainer.max_epochs={e}", f"module.optim.warmup_epochs={0.1 * e:g}"]


def presets() -> List[str]:
    """The gpu budget's rows (benchmarks/zoo_plan.py: every ViT and non-local ResNet preset), vit_softmax first (the
    probe)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from zoo_plan import BUDGETS, budget_rows

    return [row.preset for row in budget_rows(BUDGETS["gpu"])]


def probe_rate(log: Path) -> float:
    """Training img/s from the last epoch line of a run's log."""
    rates = re.findall(r"\| ([\d.]+) img/s \|", log.read_text(errors="replace")) if log.is_file() else []
    if not rates:
        raise RuntimeError(f"no epoch line with img/s in {log}")
    return float(rates[-1])


def epochs(left_s: float, runs: int, workers: int, rate: float, overhead_s: float, images: int, cap: int) -> int:
    """The most epochs (1..cap) with which ``runs`` runs, ``workers`` at a time each at rate / workers img/s and
    ``overhead_s`` of start-up, fit ``left_s``."""
    per_run = left_s / math.ceil(runs / workers) - overhead_s
    return max(1, min(cap, int(per_run * rate / (workers * images))))


def zoo(ctx: Context) -> Outcome:
    """d. Every preset at the epoch count that fits, one result file per finished run, the table over them."""
    work, out = ctx.results.parent / "zoo-work", ctx.results / "zoo"  # work: checkpoints, never archived
    budget = "cpu" if ctx.rehearse else "gpu"
    names = ctx.zoo_presets or (list(REHEARSAL_PRESETS) if ctx.rehearse else presets())
    data = tiny_data(work / "data") if ctx.rehearse else ctx.data
    extra = TINY if ctx.rehearse else []
    images = count_images(data) * 9 // 10 if ctx.rehearse else TRAIN_IMAGES
    workers, cap, report_s = (1, 1, REHEARSAL_REPORT_S) if ctx.rehearse else (WORKERS, MAX_EPOCHS, REPORT_S)

    def harness(presets_: List[str], phases: str, tag: str, overrides: List[str]):
        argv = [
            ctx.python,
            "benchmarks/zoo.py",
            "--budget",
            budget,
            "--data",
            data,
            "--presets",
            ",".join(presets_),
            "--phases",
            phases,
            "--work",
            work / tag,
            "--out",
            out / f"{tag}-report",
        ]
        return argv + [a for o in [*overrides, *extra] for a in ("--override", o)]

    if ctx.zoo_epochs:  # given: no probe (a second command joining the first one's recipe)
        steps, e, plan = [], ctx.zoo_epochs, f"{ctx.zoo_epochs} epoch(s) as asked"
    else:
        steps = [ctx.steps.run("d-probe", harness(names[:1], "train", "zoo", recipe_of(1)))]
        if not steps[0].ok:
            return Outcome(steps, f"probe failed: {steps[0].status}")
        probe_dir = work / "zoo" / names[0] / "seed0"
        rate = probe_rate(probe_dir / "harness.log")
        shutil.copy2(probe_dir / "harness.log", ctx.results / "logs" / "d-probe-harness.log")
        overhead = max(steps[0].seconds - images / rate, 5.0)
        e = epochs(ctx.steps.left() - report_s, len(names), workers, rate, overhead, images, cap)
        plan = f"probe {rate:.0f} img/s, {overhead:.0f} s start-up -> {e} epoch(s)"
        if e != 1:
            shutil.rmtree(probe_dir)  # trained with another recipe: the worker trains it again
    recipe = recipe_of(e)
    todo = [n for n in names if not (work / "zoo" / n / "seed0" / "metrics.json").is_file()]
    started = [
        ctx.steps.start(f"d-worker{i}", harness(todo[i::workers], "train", "zoo", recipe))
        for i in range(min(workers, len(todo)))
    ]
    steps += ctx.steps.wait(started, cap=ctx.steps.left() - report_s)
    steps.append(ctx.steps.run("d-report", harness(names, "report", "zoo", recipe), min_s=3))
    keep_logs(work, out / "logs")
    finished = finished_runs(out / "zoo-report" / "results.csv")
    accs = sorted(finished.values())
    headline = f"{plan}, {workers} runs at a time; {len(finished)} of {len(names)} presets finished" + (
        f"; val acc {accs[0]:.1%}-{accs[-1]:.1%}" if accs else ""
    )
    left = [n for n in names if n not in finished]
    notes = [
        f"trained with: {' '.join(recipe + extra)}",
        f"not finished: {','.join(left)}" if left else "every preset finished",
        *([f"the rest: --phases zoo --zoo-epochs {e} --zoo-presets {','.join(left)}"] if left else []),
    ]
    return Outcome(steps, headline, "\n".join(notes))


def tiny_data(root: Path, classes: int = 10, per_class: int = 10) -> Path:
    """A CIFAR-shaped JPEG tree for the rehearsal: ``root/train/<class>/<i>.jpg``, 32 x 32, a colour per class."""
    from PIL import Image

    for c in range(classes):
        folder = root / "train" / f"class{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shade = (25 * c, 255 - 25 * c, (60 * c + 20 * i) % 256)
            Image.new("RGB", (32, 32), shade).save(folder / f"{i}.jpg")
    return root


def count_images(root: Path) -> int:
    return sum(1 for _ in root.glob("train/*/*.jpg"))


def finished_runs(table: Path) -> Dict[str, float]:
    """{preset: val acc} of the report's rows."""
    if not table.is_file():
        return {}
    rows = {r["preset"]: r.get("val acc", "") for r in csv.DictReader(open(table))}
    return {preset: float(acc) for preset, acc in rows.items() if re.fullmatch(r"[\d.]+(e-?\d+)?", acc)}


def keep_logs(work: Path, dest: Path) -> None:
    """Every run's harness.log into ``dest`` as <work tag>-<preset>.log (the checkpoints stay behind)."""
    dest.mkdir(parents=True, exist_ok=True)
    for log in work.glob("*/*/seed*/harness.log"):
        tag, preset = log.parts[-4], log.parts[-3]
        shutil.copy2(log, dest / f"{tag}-{preset}.log")
