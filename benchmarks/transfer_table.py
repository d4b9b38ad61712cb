"""Attention transfer at a zoo budget: the budget's softmax row as the teacher, then per mechanism (another row of
the budget) the student as loaded, after stage 1 and after stage 2, set beside the same row trained from scratch
(the zoo's result files, docs/zoo/<budget>/per-run/<preset>-s0.json), and the robustness the converted network
keeps beside its teacher's. ``--budget cpu`` (default): the cpu ViTs (teacher vit_softmax); ``--budget pyramid``:
PVTv2-b0 at 64 px with one mechanism in every stage (teacher pvt_v2_b0_softmax; only the stages whose mechanism
differs from the teacher's are converted).

    python benchmarks/transfer_table.py --data <dir holding train/> --work logs/transfer \\
        --presets vit_linear,vit_hedgehog --stage1 0.25 --stage2 0.5          # train what is missing, then report
    python benchmarks/transfer_table.py --data <dir> --work logs/transfer --presets vit_linear \\
        --tag distill --override transfer.distill=1.0                           # a variant, in vit_linear-distill/
    python benchmarks/transfer_table.py --work logs/transfer --phases report \\
        --presets vit_linear,vit_linear-distill                                  # the table, CSV and plot only
    python benchmarks/transfer_table.py --budget pyramid --data <dir> --work logs/transfer-pyramid \\
        --teacher logs/zoo/pyramid/pvt_v2_b0_softmax/seed0 --out docs/zoo/transfer/pyramid \\
        --presets pvt_v2_b0_linear,pvt_v2_b0_focused_linear --stage1 0.25 --stage2 0.5   # the zoo's run as teacher

Work folder: ``teacher/`` (the budget's softmax row, its recipe, ``--teacher-epochs``; its ``export/`` is every
student's ``model.init_from``; ``--teacher <run dir>`` takes a finished train.py run instead, e.g. the zoo's own,
and ``teacher/`` then holds only its robustness record), ``<preset>/loaded.json`` (the stage-1 run's starting
student on the val split), ``<preset>/stage1/`` and ``<preset>/stage2/`` (train.py runs of the row's model and
overrides, experiment=transfer_<budget>: the budget's recipe with experiment=transfer's options). ``--stage1`` /
``--stage2`` are epochs of training images (a fraction runs as trainer.limit_train_batches). ``--tag T --override
K=V ...`` trains a variant of each preset (the overrides added to its loaded student and both stages) into
``<preset>-T/``, from the same teacher; its report sets each variant row under its plain run's, and a report-only call
takes such names in ``--presets``. A run with a metrics.json is done; one with a last.ckpt resumes. Each run's wall time
(``wall_s.json``) sums its attempts. The ``robustness`` phase runs eval.py on the teacher's and each finished stage
2's best checkpoint (the 15 benchmark corruptions x 5 severities and PGD L-inf 2/255 on the first 1,000 images of
the val split they trained on) into ``teacher/robustness/`` and ``<preset>/robustness/``; one with a robustness.json
is done. The report goes to ``--out`` (results.md, results.csv, transfer.png, and context.json: what its notes and
plot say about the runs); a row of ``--presets`` whose runs are not under ``--work`` (the table came from another
machine) is kept from the previous results.csv, its from-scratch cell read from the zoo again.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
import zoo_results  # noqa: E402  (sibling script modules)
from zoo import run_logged  # noqa: E402
from zoo_plan import BUDGETS, Row, budget_rows  # noqa: E402

PHASES = ("teacher", "loaded", "stage1", "stage2", "robustness", "report")
TEACHER_MECHANISM = "vit_softmax"  # the teacher is the budget's row of this mechanism
ROBUSTNESS_IMAGES = 1000  # the first val images of the split the runs trained on
PGD_EPS = 2  # PGD L-inf radius in grey levels of 255
SEED = 0  # every run's, and the loaded student's


def epoch_overrides(epochs: float) -> List[str]:
    """``epochs`` of training images as whole epochs, each limited to the same fraction of the batches."""
    whole = max(1, math.ceil(epochs))
    fraction = float(epochs / whole)  # written as a float: Lightning reads an int limit as a batch count
    return [f"trainer.max_epochs={whole}", f"++trainer.limit_train_batches={fraction!r}"]


def _train(run_dir: Path, args: List[str]) -> None:
    """train.py into ``run_dir`` (resumed from its last.ckpt when there is one), its wall time added up."""
    if (run_dir / "metrics.json").is_file():
        print(f"[done] {run_dir}", flush=True)
        return
    cmd = [sys.executable, "train.py", f"seed={SEED}", f"hydra.run.dir={run_dir}", *args]
    last = run_dir / "checkpoints" / "last.ckpt"
    if last.is_file():
        cmd.append(f"ckpt_path={last}")
    print(f"[train] {run_dir} ...", flush=True)
    start = time.time()
    run_logged(cmd, run_dir.parent / f"{run_dir.name}.harness.log")
    wall = run_dir / "wall_s.json"
    spent = json.loads(wall.read_text())["wall_s"] if wall.is_file() else 0.0
    wall.write_text(json.dumps({"wall_s": spent + time.time() - start}))
    print(f"[train] {run_dir}: {time.time() - start:.0f} s", flush=True)


def rows_of(budget: str) -> Dict[str, Row]:
    """The budget's zoo rows by preset (its table's names: vit_linear, pvt_v2_b0_linear ...)."""
    return {row.preset: row for row in budget_rows(BUDGETS[budget])}


def teacher_row(budget: str) -> Row:
    """The budget's softmax row: what the teacher is (vit_softmax; pvt_v2_b0_softmax for the pyramid budget)."""
    return next(row for row in rows_of(budget).values() if (row.mechanism or row.preset) == TEACHER_MECHANISM)


def row_of(budget: str, preset: str) -> Row:
    rows = rows_of(budget)
    if preset not in rows:
        raise SystemExit(f"{preset}: not a row of the {budget} budget; choose from {', '.join(rows)}")
    return rows[preset]


def transfer_experiment(budget: str) -> str:
    """The transfer recipe of ``budget``: configs/experiment/transfer_<cpu|pyramid>.yaml, its zoo recipe with
    experiment=transfer's options."""
    return "transfer_" + BUDGETS[budget].experiment[len("zoo_") :]


def teacher_args(budget: str, data: Path, epochs: float) -> List[str]:
    """train.py arguments of the teacher the harness trains: the budget's softmax row as the zoo trains it."""
    row = teacher_row(budget)
    return [
        f"experiment={BUDGETS[budget].experiment}",
        f"model={row.model}",
        f"data.root={data}",
        *row.overrides,
        *epoch_overrides(epochs),
    ]


def stage_args(preset: str, data: Path, teacher: Path, overrides: Sequence[str] = (), budget: str = "cpu") -> List[str]:
    """train.py arguments both stages (and the loaded student) share: the row's model and overrides under the
    budget's transfer recipe, started from the teacher's export."""
    row = row_of(budget, preset)
    return [
        f"experiment={transfer_experiment(budget)}",
        f"model={row.model}",
        f"data.root={data}",
        f"model.init_from={teacher / 'export'}",
        *row.overrides,
        *overrides,
    ]


def run_name(preset: str, tag: str = "") -> str:
    """The work folder (and table row) of ``preset``'s runs: ``vit_linear``, or ``vit_linear-distill`` for a tag."""
    return f"{preset}-{tag}" if tag else preset


def split_name(name: str) -> Tuple[str, str]:
    """(preset, tag) of a run name; presets use underscores, so the first '-' starts the tag."""
    preset, _, tag = name.partition("-")
    return preset, tag


def evaluate_loaded(
    preset: str, data: Path, teacher: Path, out: Path, overrides: Sequence[str] = (), budget: str = "cpu"
) -> None:
    """Val accuracy of the student stage 1 starts from (and of its teacher): built, seeded, as train.py builds it,
    so that a mechanism's randomly initialised parameters are the stage-1 run's."""
    if out.is_file():
        print(f"[done] {out}", flush=True)
        return
    from hydra import compose, initialize_config_dir

    from vitzoo.options import register_configs
    from vitzoo.runtime import size_thread_pools
    from vitzoo.training import build_run, evaluate

    size_thread_pools()
    register_configs()  # the schemas configs/ builds on
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=[f"seed={SEED}", *stage_args(preset, data, teacher, overrides, budget), "transfer.stage=1"],
        )
    datamodule, module = build_run(cfg)
    datamodule.setup("fit")
    start = time.time()
    student = evaluate(module.model, datamodule.val_dataloader())
    seconds = time.time() - start
    teacher_scores = evaluate(module.teacher, datamodule.val_dataloader())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "val/acc1": student["acc1"],
                "val/loss": student["loss"],
                "num_images": student["num_images"],
                "eval_s": seconds,
                "teacher_val/acc1": teacher_scores["acc1"],
            },
            indent=2,
        )
    )
    print(f"[loaded] {preset}: {student['acc1']:.4f} (teacher as loaded {teacher_scores['acc1']:.4f})", flush=True)


def evaluate_robustness(label: str, run: Path, data: Path, out: Optional[Path] = None) -> None:
    """eval.py on ``run``'s best checkpoint into ``out`` (default: ``robustness_dir(run)``; labelled ``label``): the 15
    benchmark corruptions x 5 severities and PGD L-inf ``PGD_EPS``/255 on the first ``ROBUSTNESS_IMAGES`` images
    of the val split ``run`` trained on (its recorded val_fraction and split_seed). Done when robustness.json is
    there; an unfinished run is skipped."""
    from omegaconf import OmegaConf

    out = out or robustness_dir(run)
    if (out / "robustness.json").is_file():
        print(f"[done] {out}", flush=True)
        return
    metrics = _read(run / "metrics.json")
    if metrics is None:
        print(f"[robustness] {label}: {run} has not finished, skipped", flush=True)
        return
    split = OmegaConf.load(run / ".hydra" / "config.yaml").data
    cmd = [
        sys.executable,
        "eval.py",
        f"ckpt_path={{{label}: {metrics['best_ckpt']}}}",
        "data=imagefolder",
        f"data.root={data}",
        *(
            f"data.{k}={split[k]}"
            for k in ("val_fraction", "split_seed", "eval_batch_size", "num_workers")
            if k in split
        ),
        "robustness=benchmark",
        "robustness.logit_noise=[]",
        "robustness.resolutions=[]",
        f"robustness.adversarial=[{PGD_EPS}]",
        f"robustness.max_images={ROBUSTNESS_IMAGES}",
        "robustness.progress=false",
        f"hydra.run.dir={out}",
    ]
    print(f"[robustness] {label} ...", flush=True)
    shutil.rmtree(out, ignore_errors=True)  # an interrupted eval.py leaves no record to resume from
    start = time.time()
    run_logged(cmd, out.parent / "robustness.harness.log")
    (out / "wall_s.json").write_text(json.dumps({"wall_s": time.time() - start}))
    print(f"[robustness] {label}: {time.time() - start:.0f} s", flush=True)


def robustness_dir(run: Path) -> Path:
    """Where the robustness phase evaluates ``run`` (a teacher or stage-2 run folder)."""
    return (run.parent if run.name == "stage2" else run) / "robustness"


# ---------------------------------------------------------------- report
ROBUSTNESS = ("mean corruption accuracy (15x5)", f"PGD L-inf {PGD_EPS}/255")
TEACHER_ROBUSTNESS = tuple(f"teacher {key}" for key in ROBUSTNESS)
COLUMNS = (
    "mechanism",
    "preset",
    "loaded",
    "stage 1",
    "stage 2",
    "from scratch",
    "teacher",
    "% of teacher",
    "stage 1 min",
    "stage 2 min",
    "stage 1 val transfer loss",
    *ROBUSTNESS,
    *TEACHER_ROBUSTNESS,
)
PERCENT = ("loaded", "stage 1", "stage 2", "from scratch", "teacher", *ROBUSTNESS, *TEACHER_ROBUSTNESS)


def _read(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.is_file() else None


def scratch_dir(budget: str) -> Path:
    """The zoo's result files of ``budget`` (docs/zoo/<budget>/per-run): the from-scratch rows."""
    return ROOT / "docs" / "zoo" / budget / "per-run"


def scratch_accuracy(budget: str = "cpu") -> Dict[str, float]:
    """Seed-0 val accuracy of each row of the budget's zoo table (trained from scratch, the budget's recipe), as its
    result files hold it (the rows finished so far)."""
    results = zoo_results.load_all(scratch_dir(budget), budget)
    return {r["preset"]: float(r["row"]["val acc"]) for r in results if r["seed"] == 0}


def scratch_images(budget: str = "cpu") -> Optional[int]:
    """Training images of a from-scratch row (global steps x batch size, from a result file that records them):
    89,856 for the cpu and pyramid budgets (2 epochs x 351 steps x 128); None before any has."""
    for r in zoo_results.load_all(scratch_dir(budget), budget):
        step, batch = (r.get("metrics") or {}).get("global_step"), (r.get("profile") or {}).get("batch_size")
        if step and batch:
            return int(step * batch)
    return None


def robustness_cells(run: Path, label: str, record: Optional[Path] = None) -> Dict[str, object]:
    """The two robustness columns of ``run`` (accuracies in [0, 1]) from its robustness phase's record, or what
    stands in for them: "no checkpoint" (the run has not finished), "not evaluated" (no record), "attack check
    failed" (the PGD guards of eval.py flagged the attack)."""
    if not (run / "metrics.json").is_file():
        return dict.fromkeys(ROBUSTNESS, "no checkpoint")
    record = _read((record or robustness_dir(run)) / "robustness.json")
    if record is None or label not in record["summary"]:
        return dict.fromkeys(ROBUSTNESS, "not evaluated")
    summary = record["summary"][label]
    corruption = summary.get("published", {}).get("mean_corruption_acc1")
    pgd = summary.get("pgd_linf_acc1", {}).get(f"{PGD_EPS}/255")
    return {
        ROBUSTNESS[0]: corruption if corruption is not None else "not 15x5",
        ROBUSTNESS[1]: (
            "not evaluated" if pgd is None else pgd if summary.get("attack_check") == "ok" else "attack check failed"
        ),
    }


def collect(work: Path, names: List[str], budget: str = "cpu", teacher_dir: Optional[Path] = None) -> List[dict]:
    """One row per run name (a preset, or ``<preset>-<tag>`` for a variant) that has a loaded student or a stage 1.
    ``teacher_dir``: the teacher's run (default: the work folder's ``teacher/``)."""
    labels = {preset: row.label for preset, row in rows_of(budget).items()}
    teacher_dir = teacher_dir or work / "teacher"
    teacher = _read(teacher_dir / "metrics.json")
    cells = robustness_cells(teacher_dir, "teacher", work / "teacher" / "robustness")
    teacher_robustness = dict(zip(TEACHER_ROBUSTNESS, cells.values()))
    scratch = scratch_accuracy(budget)
    control = teacher_row(budget).preset  # the teacher's own mechanism as a student: what more training alone gives
    rows = []
    for name in names:
        preset, tag = split_name(name)
        loaded = _read(work / name / "loaded.json")
        s1, s2 = _read(work / name / "stage1" / "metrics.json"), _read(work / name / "stage2" / "metrics.json")
        if loaded is None and s1 is None:
            continue
        w1, w2 = _read(work / name / "stage1" / "wall_s.json"), _read(work / name / "stage2" / "wall_s.json")
        row = {
            "mechanism": labels.get(preset, preset)
            + (" (control)" if preset == control else "")
            + (f", {tag}" if tag else ""),
            "preset": name,
            "loaded": loaded and loaded["val/acc1"],
            "stage 1": s1 and s1["val/acc1"],
            "stage 2": s2 and s2["val/acc1"],
            "from scratch": scratch.get(preset),
            "teacher": teacher and teacher["best_score"],  # the checkpoint its export (init_from) holds
            "stage 1 min": w1 and w1["wall_s"] / 60,
            "stage 2 min": w2 and w2["wall_s"] / 60,
            "stage 1 val transfer loss": s1 and s1.get("val/transfer_loss"),
        }
        row["% of teacher"] = row["stage 2"] / row["teacher"] * 100 if row["stage 2"] and row["teacher"] else None
        rows.append({**row, **robustness_cells(work / name / "stage2", name), **teacher_robustness})
    return rows


def _cell(key: str, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if key in PERCENT:
        return f"{value * 100:.1f}"
    if key == "stage 1 val transfer loss":
        return f"{value:.3g}"
    return f"{value:.1f}"


def teacher_training(teacher_dir: Path) -> Optional[str]:
    """What the teacher (the train.py run ``teacher_dir``) was trained on: "2 epochs, 89,856 training images" (an
    epoch limited to a fraction of its batches says so); None before it has finished."""
    from omegaconf import OmegaConf

    metrics, config = _read(teacher_dir / "metrics.json"), teacher_dir / ".hydra" / "config.yaml"
    if metrics is None or not config.is_file():
        return None
    cfg = OmegaConf.load(config)
    fraction = cfg.trainer.get("limit_train_batches", 1.0)
    epochs = f"{metrics['epoch']} epoch{'s' if metrics['epoch'] != 1 else ''}" + (
        f" of {fraction:g} of the batches" if isinstance(fraction, float) and fraction < 1 else ""
    )
    return f"{epochs}, {metrics['global_step'] * cfg.data.batch_size:,} training images"


def _scratch_source(budget: str) -> str:
    images = scratch_images(budget)
    return f"docs/zoo/{budget}" + (f", {images:,} training images" if images else "")


def report_context(work: Path, first: str, teacher_dir: Path, previous: Path) -> dict:
    """What the notes and the plot say about the runs: the teacher's training and best val top-1, the images each
    stage saw, the input size and the val images of the first row's runs. A value its run does not hold here (a
    report made on a machine without the runs) comes from ``previous``, the context.json of the last report."""
    loaded, metrics = _read(work / first / "loaded.json"), _read(teacher_dir / "metrics.json")
    found = {
        "teacher": teacher_training(teacher_dir),
        "teacher best": metrics and metrics["best_score"],
        "images": _images(work, first),
        "img size": _img_size(work, first),
        "val images": loaded and loaded["num_images"],
    }
    missing = {None, "?", (0, 0)}
    old = _read(previous) or {}
    return {k: old.get(k, v) if (tuple(v) if isinstance(v, list) else v) in missing else v for k, v in found.items()}


def kept_rows(rows: List[dict], names: List[str], out: Path, budget: str) -> List[dict]:
    """``rows`` with, in ``names``' order, the rows of ``out``/results.csv whose runs are not under the work folder
    (a report on a machine without them keeps them as they were, the from-scratch cell read from the zoo again)."""
    found = {row["preset"]: row for row in rows}
    if not (out / "results.csv").is_file():
        return rows
    with open(out / "results.csv", newline="") as f:
        previous = {row["preset"]: row for row in csv.DictReader(f)}
    scratch, merged = scratch_accuracy(budget), []
    for name in names:
        if name in found:
            merged.append(found[name])
        elif name in previous:
            print(f"[report] {name}: its runs are not under the work folder; its row is kept from {out}/results.csv")
            row = {k: _csv_value(v) for k, v in previous[name].items()}
            merged.append({**row, "from scratch": scratch.get(split_name(name)[0])})  # a variant's: its preset's
    return merged


def _csv_value(text: str):
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _notes(context: dict, budget: str) -> List[str]:
    """The lines under the table: the teacher as trained, and what the robustness columns measure."""
    lines = []
    if context["teacher"] is not None:
        lines.append(
            f"- teacher: {teacher_row(budget).preset}, {context['teacher']}, val top-1 {context['teacher best']:.1%} "
            f"(its best checkpoint, which every student loads); from scratch: {_scratch_source(budget)}"
        )
    lines.append(
        f"- {ROBUSTNESS[0]}, {ROBUSTNESS[1]}: `eval.py robustness=benchmark` on the best checkpoint of "
        f"stage 2 (teacher: its own) over the first {ROBUSTNESS_IMAGES:,} val images: mean top-1 over the 15 "
        f"CIFAR-10-C corruptions x severities 1-5, and top-1 under PGD (10 steps, L-inf eps {PGD_EPS}/255 of "
        f"a [0, 1] image); a pass on {ROBUSTNESS_IMAGES:,} images is uncertain by up to +-3.1 points "
        f"(Wilson 95%)"
    )
    return lines


def write_report(
    rows: List[dict], out: Path, work: Path, budget: str = "cpu", teacher_dir: Optional[Path] = None
) -> None:
    teacher_dir = teacher_dir or work / "teacher"
    out.mkdir(parents=True, exist_ok=True)
    context = report_context(work, rows[0]["preset"], teacher_dir, out / "context.json") if rows else {}
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(k, row[k]) for k in COLUMNS) + " |" for row in rows]
    lines += ["", *_notes(context, budget)] if rows else []
    (out / "results.md").write_text("\n".join(lines) + "\n")
    if rows:
        (out / "context.json").write_text(json.dumps(context, indent=1) + "\n")
        plot(rows, out / "transfer.png", budget, context)
    print("\n".join(lines))


def plot(rows: List[dict], path: Path, budget: str, context: dict) -> None:
    """Val accuracy per stage beside from scratch and the teacher; below it, where the robustness phase ran, each
    converted network's robustness beside its teacher's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    robust = any(isinstance(row[key], float) for row in rows for key in ROBUSTNESS)
    width_in = max(9.0, 1.6 + 1.3 * len(rows))  # the titles fit
    fig, axes = plt.subplots(2 if robust else 1, 1, figsize=(width_in, 8.6 if robust else 4.6), squeeze=False)
    ax = axes[0, 0]
    _bars(ax, rows, ("loaded", "stage 1", "stage 2", "from scratch"))
    teacher = rows[0]["teacher"]
    if teacher:
        ax.axhline(teacher * 100, color="k", linestyle="--", linewidth=1, label="softmax teacher")
        ax.axhline(teacher * 95, color="grey", linestyle=":", linewidth=1, label="95% of the teacher")
    val_images, images = context["val images"], context["images"]
    ax.set_ylabel(f"val top-1 (%), {val_images:,} images" if val_images else "val top-1 (%)")
    teacher_preset = teacher_row(budget).preset
    ax.set_title(
        f"Attention transfer from {teacher_preset}, CIFAR-10 JPEG split, {context['img size']} px\n"
        f"training images: stage 1 {images[0]:,} + stage 2 {images[1]:,}; from scratch: {_scratch_source(budget)}\n"
        f"teacher ({teacher_preset}): {context['teacher'] or 'not finished'}",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    if robust:
        from vitzoo.robustness.intervals import accuracy_interval

        ax = axes[1, 0]
        _bars(ax, rows, ROBUSTNESS, lambda value: accuracy_interval(value, ROBUSTNESS_IMAGES))
        for key, teacher_key, colour in zip(ROBUSTNESS, TEACHER_ROBUSTNESS, ("C0", "C1")):
            value = rows[0][teacher_key]
            if isinstance(value, float):
                ax.axhline(value * 100, color=colour, linestyle="--", linewidth=1, label=f"teacher's {key}")
        ax.set_ylabel(f"top-1 (%), first {ROBUSTNESS_IMAGES:,} val images")
        ax.set_title(
            "Robustness of the stage-2 networks beside the teacher's (bars: Wilson 95% interval; "
            "no bar: not evaluated)",
            fontsize=9,
        )
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ax, rows: List[dict], series, interval=None) -> None:
    """One group of bars per row, one bar per key of ``series`` (a cell that is not a number draws none), with
    ``interval(value)`` (low, high) as error bars when given; percent axis from 0 to 100."""
    width = 0.8 / len(series)
    for i, key in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
        values = [row[key] if isinstance(row[key], float) else math.nan for row in rows]
        errors = None
        if interval is not None:
            bounds = [interval(v) if not math.isnan(v) else (math.nan, math.nan) for v in values]
            errors = [
                [100 * (v - lo) for v, (lo, _) in zip(values, bounds)],
                [100 * (hi - v) for v, (_, hi) in zip(values, bounds)],
            ]
        ax.bar(xs, [100 * v for v in values], width, yerr=errors, capsize=2 if errors else 0, label=key)
    ax.set_xticks(range(len(rows)), [textwrap.fill(row["mechanism"], 16) for row in rows], fontsize=8)  # no overlap
    ax.set_ylim(0, 100)


def _img_size(work: Path, preset: str) -> object:
    """The input size the row's stage 1 trained at ("?" before it has run)."""
    from omegaconf import OmegaConf

    config = work / preset / "stage1" / ".hydra" / "config.yaml"
    return OmegaConf.load(config).data.img_size if config.is_file() else "?"


def _images(work: Path, preset: str) -> List[int]:
    """Training images each stage saw: global steps x the batch size, from its metrics.json and config."""
    from omegaconf import OmegaConf

    seen = []
    for stage in ("stage1", "stage2"):
        run = work / preset / stage
        metrics, config = _read(run / "metrics.json"), run / ".hydra" / "config.yaml"
        seen.append(
            metrics["global_step"] * OmegaConf.load(config).data.batch_size if metrics and config.is_file() else 0
        )
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, help="the CIFAR-10 JPEG tree (a folder holding train/<class>/*.jpg)")
    p.add_argument(
        "--budget", default="cpu", choices=("cpu", "pyramid"), help="the zoo budget: its rows, recipe, teacher"
    )
    p.add_argument("--work", type=Path, default=ROOT / "logs" / "transfer")
    p.add_argument(
        "--teacher",
        type=Path,
        help="a finished train.py run of the budget's softmax row (e.g. the zoo's) to use as the teacher, "
        "instead of training <work>/teacher",
    )
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "zoo" / "transfer")
    p.add_argument("--presets", default="vit_linear,vit_hedgehog", help="comma-separated model presets, in order")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {PHASES}")
    p.add_argument("--teacher-epochs", type=float, default=2.0)
    p.add_argument("--stage1", type=float, default=0.5, help="stage 1's epochs of training images")
    p.add_argument("--stage2", type=float, default=1.5, help="stage 2's epochs of training images")
    p.add_argument("--tag", default="", help="a variant's name: its runs go to <preset>-<tag>/ (letters, digits, _)")
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train.py override for the variant's loaded student and both stages (repeatable; needs --tag)",
    )
    args = p.parse_args()
    phases, presets = args.phases.split(","), args.presets.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"--phases: unknown {unknown}; choose from {list(PHASES)}")
    if args.override and not args.tag:
        raise SystemExit("--override changes the runs: give it a --tag, so that they go beside the plain ones")
    if args.tag and not args.tag.replace("_", "").isalnum():
        raise SystemExit(f"--tag={args.tag!r}: use letters, digits and _ only (the folder is <preset>-<tag>)")
    if set(phases) - {"report"} and (args.data is None or not (args.data / "train").is_dir()):
        raise SystemExit(f"--data={args.data}: give the folder holding train/<class>/*.jpg")
    budget = args.budget
    for preset in presets:
        row_of(budget, split_name(preset)[0])  # a name of another budget: one line, before anything runs
    work = args.work.resolve()
    teacher = args.teacher.resolve() if args.teacher else work / "teacher"
    if args.teacher and not (teacher / "metrics.json").is_file() and set(phases) - {"report"}:
        raise SystemExit(f"--teacher={args.teacher}: no metrics.json there; give a finished train.py run")
    if "teacher" in phases and not args.teacher:
        _train(teacher, teacher_args(budget, args.data, args.teacher_epochs))
    if "robustness" in phases:
        evaluate_robustness("teacher", teacher, args.data, work / "teacher" / "robustness")
    names = [run_name(preset, args.tag) for preset in presets]
    rows = list(dict.fromkeys(row for preset, name in zip(presets, names) for row in (preset, name)))  # plain first
    for preset, name in zip(presets, names):
        base = stage_args(preset, args.data, teacher, args.override, budget)
        if "loaded" in phases:
            evaluate_loaded(preset, args.data, teacher, work / name / "loaded.json", args.override, budget)
        if "stage1" in phases:
            _train(work / name / "stage1", [*base, "transfer.stage=1", *epoch_overrides(args.stage1)])
        if "stage2" in phases:
            student = work / name / "stage1" / "checkpoints" / "last.ckpt"
            _train(
                work / name / "stage2",
                [*base, "transfer.stage=2", *epoch_overrides(args.stage2), f"transfer.student={student}"],
            )
        if "robustness" in phases:
            evaluate_robustness(name, work / name / "stage2", args.data)
        if "report" in phases and set(phases) != {"report"}:  # after each preset: a stopped call keeps its rows
            report(work, rows, budget, teacher, args.out)
    if phases == ["report"]:
        report(work, rows, budget, teacher, args.out)


def report(work: Path, names: List[str], budget: str, teacher: Path, out: Path) -> None:
    write_report(kept_rows(collect(work, names, budget, teacher), names, out, budget), out, work, budget, teacher)


if __name__ == "__main__":
    main()
