"""The zoo's table: results.csv (one line per run) and results.md (one row per preset, with what the numbers are)."""
from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import zoo_results
from zoo_plan import PRESETS, ROOT, Budget, recipe_path

COLUMNS = ("mechanism", "preset", "seeds", "params", "MFLOPs/img", "train img/s", "peak train MB", "val acc",
           "gauss sev1-5", "logit sigma=1", "2x res", "entropy init", "entropy end", "entropy 2x res")
CSV_ONLY = ("eval clean acc", "torch", "hardware")  # in results.csv, not in the table


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def order(result: dict) -> tuple:
    """Rows in the order of the presets (softmax first), then by seed."""
    presets = [preset for _, preset in PRESETS]
    return (presets.index(result["preset"]) if result["preset"] in presets else len(presets), result["preset"],
            result["seed"])


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
    if key.startswith("entropy"):
        return " / ".join(f"{v:.3f}" for v in known)
    cell = " / ".join(f"{100 * v:.1f}" for v in known)  # accuracies in %, one per seed
    return cell + (f" (mean {100 * mean(known):.1f})" if len(known) > 1 else "")


def _provenance(results: List[dict]) -> str:
    """Which machine and torch each row was profiled on (rows may come from several calls and machines)."""
    groups: Dict[str, List[str]] = {}
    for r in results:
        where = f"{r['profile'].get('hardware', 'hardware not recorded')}, torch {r['row'].get('torch') or '?'}"
        names = groups.setdefault(where, [])
        if f"`{r['preset']}`" not in names:
            names.append(f"`{r['preset']}`")
    if len(groups) == 1:
        return f"{next(iter(groups))} for every row"
    return "; ".join(f"{where} for {', '.join(names)}" for where, names in groups.items())


def write_csv(results: List[dict], path: Path) -> None:
    """One line per run: every table number unformatted, plus ``CSV_ONLY``."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["mechanism", "preset", "seed", *COLUMNS[3:], *CSV_ONLY])
        for r in results:
            cells = {**r["row"], "hardware": r["profile"].get("hardware")}
            writer.writerow([r["label"], r["preset"], r["seed"], *[cells.get(k) for k in (*COLUMNS[3:], *CSV_ONLY)]])


def _table(rows: Dict[str, List[dict]]) -> List[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for preset, preset_rows in rows.items():
        cells = [preset_rows[0]["label"], f"`{preset}`", ",".join(str(r["seed"]) for r in preset_rows)]
        cells += [_fmt(k, [r["row"][k] for r in preset_rows]) for k in COLUMNS[3:]]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_markdown(results: List[dict], budget_name: str, budget: Budget, command: str, curves: List[dict],
                   path: Path) -> None:
    """results.md: what the runs are and how each column was measured, the table, and the plots (the sweep
    curves only where ``curves``, the runs with eval records, is not empty)."""
    exp = recipe_path(budget).relative_to(ROOT)
    batches = sorted({r["profile"]["batch_size"] for r in results if "batch_size" in r["profile"]})
    batch = "batch " + " / ".join(map(str, batches)) if batches else "batch size not recorded"
    sweep = next((r["robustness"]["sweep"] for r in results if r["robustness"]), {})
    extra = results[0]["overrides"]
    no_curves = [f"`{zoo_results.file_name(r['preset'], r['seed'])}`" for r in results if r not in curves]
    text = [
        f"# Zoo benchmark, `{budget_name}` budget", "",
        f"{len(results)} runs, one result file each in `per-run/`, merged by `{command}` on "
        f"{time.strftime('%Y-%m-%d')}. Profiled on {_provenance(results)}.", "",
        f"Recipe: `{exp}`" + (f" with `{' '.join(extra)}`" if extra else "") + " (same data split, seed, "
        "augmentation, optimiser and epochs for every row); model size: "
        f"ViT `{budget.vit_kwargs}`, non-local ResNet-18 `{budget.resnet_kwargs or 'full width'}`.",
        f"Robustness columns: eval.py with `robustness={budget.robustness}` on the first "
        f"{budget.eval_images or 'all'} val images (Gaussian noise severities {sweep.get('severities')}, protocol "
        f"{sweep.get('protocol') or 'by size'}; logit-noise sigma in {sweep.get('logit_noise')}; inputs at "
        f"{sweep.get('resolutions')} x the training size). Accuracies in %, one value per seed.",
        f"Params / FLOPs (forward, one image, attention matmuls included) / img/s (training step, {batch}) / peak "
        "memory (on a GPU: torch's max allocated under bf16 autocast; on the CPU: resident set above the process "
        "baseline, fp32) during those steps come from the profile phase, run one "
        "model at a time on the same machine. Entropy: mean over layers of H / log n of the attention rows (1 = "
        "uniform) on 32 val images, before training and after the last epoch; at 2x res, the same on the first 32 "
        "eval images at twice the training size.", "",
        *_table(by_preset(results)), "",
        "![summary](summary.png)", "",
    ]
    if curves:
        text += ["![gaussian noise](corruptions.png) ![logit noise](logit_noise.png) ![resolution](resolution.png)", ""]
    if no_curves:
        text += [f"No sweep curves for {', '.join(no_curves)}: converted from the table of an earlier harness "
                 "version, which kept the numbers but not the sweep records.", ""]
    path.write_text("\n".join(text))
