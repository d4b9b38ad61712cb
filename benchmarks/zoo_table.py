"""The zoo's table: results.csv (one line per run) and results.md (one row per preset, with what the numbers are)."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

import zoo_results
from zoo_plan import BUDGETS, ROOT, Budget, budget_rows, recipe_path
from zoo_results import CORRUPTION_15X5, PGD_2, PGD_CHECK

COLUMNS = ("mechanism", "preset", "seeds", *zoo_results.TABLE_KEYS)
CSV_ONLY = ("eval clean acc", "torch", "hardware", PGD_CHECK)  # in results.csv, not in the table
SAYS_WHY = (CORRUPTION_15X5, PGD_2)  # columns whose missing value names its reason (in the table and the CSV)
NO_CHECKPOINT, EVAL_PENDING = "not run: no checkpoint", "not run: eval phase pending"
Checkpoints = Set[Tuple[str, int]]  # (preset, seed) of the runs whose checkpoint is in the work dir


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def order(result: dict) -> tuple:
    """Rows in the order of the budget's rows (softmax first), then by seed."""
    presets = [row.preset for row in budget_rows(BUDGETS[result["budget"]])]
    return (
        presets.index(result["preset"]) if result["preset"] in presets else len(presets),
        result["preset"],
        result["seed"],
    )


def with_records(results: List[dict]) -> List[dict]:
    """The results that hold eval records (those the sweep curves are drawn from)."""
    return [r for r in results if (r["robustness"] or {}).get("records")]


def why_missing(result: dict, key: str, checkpoints: Checkpoints) -> str:
    """What a ``SAYS_WHY`` cell without a value says: the attack check that failed, or that the test did not run
    and whether the checkpoint to run it on is in the work dir."""
    check = result["row"].get(PGD_CHECK)
    if key == PGD_2 and check not in (None, "ok"):
        return f"attack check {check}"
    return EVAL_PENDING if (result["preset"], result["seed"]) in checkpoints else NO_CHECKPOINT


def by_preset(results: List[dict]) -> Dict[str, List[dict]]:
    """The result files grouped into the table's rows, in the given order."""
    rows: Dict[str, List[dict]] = {}
    for r in results:
        rows.setdefault(r["preset"], []).append(r)
    return rows


def _fmt(key: str, values: List[Optional[float]]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    if key == "params":
        return f"{known[0] / 1e6:.2f}M"
    if key in ("MFLOPs/img", "train img/s", "peak train MB"):
        return f"{mean(known):.0f}"
    entropy = key.startswith("entropy")  # a fraction of log n; the other cells are accuracies, in %
    cell = " / ".join("-" if v is None else (f"{v:.3f}" if entropy else f"{100 * v:.1f}") for v in values)
    if entropy or len(known) < 2:
        return cell
    of = "" if len(known) == len(values) else f" of {len(known)} seeds"
    return cell + f" (mean {100 * mean(known):.1f}{of})"


def _provenance(results: List[dict]) -> str:
    """The sentence naming which machine and torch each row was profiled on (rows may come from several calls and
    machines), and which rows were not profiled."""
    groups: Dict[str, List[str]] = {}
    unprofiled: List[str] = []
    for r in results:
        name = f"`{r['preset']}`"
        names = (
            groups.setdefault(f"{r['profile']['hardware']}, torch {r['row']['torch']}", [])
            if r["profile"]
            else unprofiled
        )
        if name not in names:
            names.append(name)
    if not groups:
        return "Not profiled (the profile phase did not run), so the params, FLOPs, img/s and memory cells are empty."
    if len(groups) == 1 and not unprofiled:
        return f"Profiled on {next(iter(groups))} for every row."
    said = "; ".join(f"{where} for {', '.join(names)}" for where, names in groups.items())
    return f"Profiled on {said}" + (f"; not profiled: {', '.join(unprofiled)}." if unprofiled else ".")


def write_csv(results: List[dict], checkpoints: Checkpoints, path: Path) -> None:
    """One line per run: every table number unformatted (a ``SAYS_WHY`` cell without one: why), plus ``CSV_ONLY``."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["mechanism", "preset", "seed", *COLUMNS[3:], *CSV_ONLY])
        for r in results:
            cells = {**r["row"], "hardware": r["profile"].get("hardware")}
            cells.update({k: why_missing(r, k, checkpoints) for k in SAYS_WHY if cells.get(k) is None})
            writer.writerow([r["label"], r["preset"], r["seed"], *[cells.get(k) for k in (*COLUMNS[3:], *CSV_ONLY)]])


MACHINE_CELLS = ("train img/s", "peak train MB")  # measured: a mean over seeds needs one machine


def _cell(key: str, preset_rows: List[dict], checkpoints: Checkpoints) -> str:
    values = [r["row"].get(key) for r in preset_rows]
    if key in SAYS_WHY and all(v is None for v in values):
        return why_missing(preset_rows[0], key, checkpoints)
    if key in MACHINE_CELLS and len({r["profile"].get("hardware") for r in preset_rows if r["profile"]}) > 1:
        return " / ".join("-" if v is None else f"{v:.0f}" for v in values)  # one per seed, in seed order
    return _fmt(key, values)


def _table(rows: Dict[str, List[dict]], checkpoints: Checkpoints) -> List[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for preset, preset_rows in rows.items():
        cells = [preset_rows[0]["label"], f"`{preset}`", ",".join(str(r["seed"]) for r in preset_rows)]
        cells += [_cell(k, preset_rows, checkpoints) for k in COLUMNS[3:]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _model_sizes(budget: Budget) -> str:
    if not budget.pyramid:
        return f"model size: ViT `{budget.vit_kwargs}`, non-local ResNet-18 `{budget.resnet_kwargs or 'full width'}`"
    models = "; ".join(f"`{row.preset}`: `model={row.model} {' '.join(row.overrides)}`" for row in budget_rows(budget))
    return f"each row's model: {models}"


def beside(results: List[dict], budget: Budget, path: Path = ROOT / "docs" / "zoo") -> List[str]:
    """The rows of the same mechanism in ``budget.beside``'s table (its results.csv), each under a row of these:
    val accuracy, 15x5 corruptions and PGD as each table has them (seeds joined by " / ")."""
    if budget.beside is None:
        return []
    source = path / budget.beside / "results.csv"
    if not source.is_file():
        return [f"No `{budget.beside}` table to set these rows beside ({source.relative_to(ROOT)} is missing).", ""]
    with open(source) as f:
        other: Dict[str, List[dict]] = {}
        for line in csv.DictReader(f):
            other.setdefault(line["preset"], []).append(line)
    mechanisms = {row.preset: row.mechanism for row in budget_rows(budget)}
    keys = ("val acc", CORRUPTION_15X5, PGD_2)

    def pct(value) -> str:
        try:
            return f"{100 * float(value):.1f}"
        except (TypeError, ValueError):
            return str(value) if value else "-"

    lines = [
        f"## Beside the `{budget.beside}` budget's row of the same mechanism",
        "",
        "| row | preset | seeds | " + " | ".join(keys) + " |",
        "|---|---|---|" + "---|" * len(keys),
    ]
    for preset, runs in by_preset(results).items():
        lines.append(
            f"| {runs[0]['label']} | `{preset}` | {','.join(str(r['seed']) for r in runs)} | "
            + " | ".join(" / ".join(pct(r["row"].get(k)) for r in runs) for k in keys)
            + " |"
        )
        vit = other.get(mechanisms.get(preset) or "", [])
        if vit:
            lines.append(
                f"| beside it: {vit[0]['mechanism']} | `{vit[0]['preset']}` ({budget.beside}) | "
                f"{','.join(v['seed'] for v in vit)} | "
                + " | ".join(" / ".join(pct(v[k]) for v in vit) for k in keys)
                + " |"
            )
    return [*lines, ""]


def write_markdown(
    results: List[dict],
    budget_name: str,
    budget: Budget,
    command: str,
    checkpoints: Checkpoints,
    drawn: List[str],
    path: Path,
) -> None:
    """results.md: what the runs are and how each column was measured, the table, a note on the cells that were
    not measured, and the plots (``drawn``: the sweep curves' files)."""
    curves = with_records(results)
    table = _table(by_preset(results), checkpoints)
    exp = recipe_path(budget).relative_to(ROOT)
    batches = sorted({r["profile"]["batch_size"] for r in results if "batch_size" in r["profile"]})
    batch = "batch " + " / ".join(map(str, batches)) if batches else "batch size not recorded"
    sweep = next((r["robustness"]["sweep"] for r in results if r["robustness"]), {})
    extra = results[0]["overrides"]
    no_curves = [f"`{zoo_results.file_name(r['preset'], r['seed'])}`" for r in results if r not in curves]
    text = [
        f"# Zoo benchmark, `{budget_name}` budget",
        "",
        f"{len(results)} runs, one result file each in `per-run/`, merged by `{command}` on "
        f"{time.strftime('%Y-%m-%d')}. {_provenance(results)}",
        "",
        f"Recipe: `{exp}`" + (f" with `{' '.join(extra)}`" if extra else "") + " (same data split, seed, "
        f"augmentation, optimiser and epochs for every row); {_model_sizes(budget)}.",
        f"Robustness columns: eval.py with `robustness={budget.robustness}` on the first "
        f"{budget.eval_images or 'all'} val images (Gaussian noise severities {sweep.get('severities')}, protocol "
        f"{sweep.get('protocol') or 'by size'}; logit-noise sigma in {sweep.get('logit_noise')}; inputs at "
        f"{sweep.get('resolutions')} x the training size). Accuracies in %, one value per seed.",
        f"{CORRUPTION_15X5}: top-1 over the 15 CIFAR-10-C corruptions x severities 1-5 (RobustBench's corruption "
        f"number; eval.py's `published.mean_corruption_acc1`); {PGD_2}: top-1 under PGD-10 at eps 2/255 of the "
        "[0, 1] image (step 2.5 eps / 10, random start; FGSM beside it checks the attack), both on the same images.",
        f"Params / FLOPs (forward, one image, attention matmuls included) / img/s (training step, {batch}) / peak "
        "memory (on a GPU: torch's max allocated under bf16 autocast; on the CPU: resident set above the process "
        "baseline, fp32) during those steps come from the profile phase, run one "
        "model at a time on the same machine (a row whose seeds were profiled on different machines shows the "
        "img/s and memory of each seed, not their mean). Entropy: mean over layers of H / log n of the attention "
        "rows (1 = uniform) on 32 val images, before training and after the last epoch; at 2x res, the same on "
        "the first 32 eval images at twice the training size.",
        "",
        *table,
        "",
    ]
    not_run = [status for status in (NO_CHECKPOINT, EVAL_PENDING) if any(status in line for line in table)]
    if NO_CHECKPOINT in not_run:
        text += [
            f"`{NO_CHECKPOINT}`: the run's result file holds no records of these tests (its eval sweep did "
            "not include them) and its checkpoint is not in the work dir (result files are kept, "
            "checkpoints are not), so only training the run again can measure them.",
            "",
        ]
    if EVAL_PENDING in not_run:
        text += [
            f"`{EVAL_PENDING}`: the run's checkpoint is in the work dir, but its eval records lack these tests: "
            "`--phases eval,report` measures them.",
            "",
        ]
    text += beside(results, budget)
    text += ["![summary](summary.png)", ""]
    if curves:
        adversarial = " ![adversarial](adversarial.png)" if "adversarial.png" in drawn else ""
        text += [
            "![gaussian noise](corruptions.png) ![logit noise](logit_noise.png) ![resolution](resolution.png)"
            + adversarial,
            "",
        ]
    if no_curves:
        text += [
            f"No sweep curves for {', '.join(no_curves)}: converted from the table of an earlier harness "
            "version, which kept the numbers but not the sweep records.",
            "",
        ]
    path.write_text("\n".join(text))
