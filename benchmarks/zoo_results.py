"""The zoo's per-run result files: one small JSON per trained run, and the merge that completes a zoo across calls.

A result file (``<out>/per-run/<preset>-s<seed>.json``) holds everything the table and plots need of one run::

    {"format": 1, "budget": "gpu", "label": "softmax", "preset": "vit_softmax", "seed": 0,
     "recipe": "zoo_gpu", "overrides": [...],            # the train.py overrides beyond the budget's model size
     "row": {"val acc": ..., "gauss sev1-5": ..., ...},  # the table's numbers (see ROW_KEYS)
     "metrics": {...},                                   # train.py's metrics.json (accuracy, entropy per layer)
     "profile": {...},                                   # params, FLOPs, img/s, peak memory, torch, hardware
     "robustness": {"sweep": {...}, "img_size": 32, "protocol": "cifar", "records": [...]}}   # eval.py's, this run's

Files converted from the table of an earlier harness version carry ``row`` but no ``robustness`` records (their
sweep curves were not kept); the table shows them, the plots cannot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

FORMAT = 1
CORRUPTION_15X5, PGD_2 = "mean corruption accuracy (15x5)", "PGD L-inf 2/255"
PGD_CHECK = "PGD attack check"  # eval.py's guard against a silently broken attack: "ok" or what failed
TABLE_KEYS = (  # a run's numbers as the table shows them (zoo_table.COLUMNS after mechanism, preset, seeds)
    "params",
    "MFLOPs/img",
    "train img/s",
    "peak train MB",
    "val acc",
    "gauss sev1-5",
    "logit sigma=1",
    "2x res",
    CORRUPTION_15X5,
    PGD_2,
    "entropy init",
    "entropy end",
    "entropy 2x res",
)
ROW_KEYS = (*TABLE_KEYS, "eval clean acc", "torch", PGD_CHECK)


def file_name(preset: str, seed: int) -> str:
    return f"{preset}-s{seed}.json"


def _mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _layer_mean(metrics: dict, prefix: str) -> Optional[float]:
    return _mean([v for k, v in metrics.items() if k.startswith(prefix)])


def eval_summary(robustness: Optional[dict]) -> Dict[str, object]:
    """eval.py's summary of one run's records (``vitzoo.robustness.report.summarize``, with the published
    corruption means where the result file names the protocol); {} for a run without records."""
    records = (robustness or {}).get("records")
    if not records:
        return {}
    from vitzoo.robustness.report import summarize

    label, protocol = records[0]["checkpoint"], robustness.get("protocol")
    return summarize(records, None, {label: protocol} if protocol else None)[label]


def table_row(metrics: dict, profile: dict, robustness: Optional[dict]) -> Dict[str, object]:
    """The table's numbers of one run (None where a phase has not produced them; PGD also where its attack
    check failed)."""
    records = (robustness or {}).get("records", [])
    summary = eval_summary(robustness)
    check = summary.get("attack_check")

    def acc(test: str, level=None) -> List[float]:
        return [r["acc1"] for r in records if r["test"] == test and (level is None or r["level"] == level)]

    clean = [r for r in records if r["test"] == "clean"]
    res = [r for r in records if r["test"] == "resolution"]
    res2 = [r for r in res if r["level"] == max(x["level"] for x in res)]  # the largest size (2x)
    return {
        "params": profile.get("params"),
        "MFLOPs/img": profile["flops_per_image"] / 1e6 if "flops_per_image" in profile else None,
        "train img/s": profile.get("train_img_per_s"),
        "peak train MB": profile.get("peak_train_mb"),
        "val acc": metrics["val/acc1"],
        "gauss sev1-5": _mean(acc("gaussian_noise")),
        "logit sigma=1": next(iter(acc("logit_noise", 1)), None),
        "2x res": res2[0]["acc1"] if res2 else None,
        CORRUPTION_15X5: summary.get("published", {}).get("mean_corruption_acc1"),
        PGD_2: summary.get("pgd_linf_acc1", {}).get("2/255") if check == "ok" else None,
        PGD_CHECK: check,
        "entropy init": _layer_mean(metrics, "entropy_init/"),
        "entropy end": _layer_mean(metrics, "entropy/"),
        "entropy 2x res": res2[0].get("entropy") if res2 else None,
        "eval clean acc": clean[0]["acc1"] if clean else None,
        "torch": profile.get("torch"),
    }


def build(
    budget: str,
    label: str,
    preset: str,
    seed: int,
    recipe: str,
    overrides: Sequence[str],
    metrics: dict,
    profile: dict,
    robustness: Optional[dict],
) -> dict:
    """One run's result file; ``robustness`` holds this run's records only (``checkpoint`` = its eval key)."""
    return {
        "format": FORMAT,
        "budget": budget,
        "label": label,
        "preset": preset,
        "seed": seed,
        "recipe": recipe,
        "overrides": list(overrides),
        "row": table_row(metrics, profile, robustness),
        "metrics": {k: v for k, v in metrics.items() if not k.startswith("best_")},  # no local paths
        "profile": profile,
        "robustness": robustness,
    }


def read(path: Path, budget: str) -> dict:
    """A result file, checked; anything else is a one-line error naming the file and the fix."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(
            f"{path}: not a readable zoo result file ({err}); pass the files from a zoo run's <out>/per-run/ folder"
        )
    missing = [
        k
        for k in ("format", "budget", "label", "preset", "seed", "recipe", "overrides", "row")
        if not isinstance(result, dict) or k not in result
    ]
    if missing:
        raise SystemExit(
            f"{path}: not a zoo result file (no {', '.join(missing)}); pass the files from a zoo run's "
            "<out>/per-run/ folder"
        )
    if result["format"] != FORMAT:
        raise SystemExit(
            f"{path}: result format {result['format']}, this harness reads format {FORMAT}; "
            "re-run its report phase with the harness that wrote it"
        )
    if result["budget"] != budget:
        raise SystemExit(f"{path}: a `{result['budget']}` budget result; merge it with --budget {result['budget']}")
    return result


def write(result: dict, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(result["preset"], result["seed"])
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return path


def _phases(result: dict) -> set:
    """The phases a result file holds besides training."""
    return {
        name
        for name, there in (("profile", result["profile"]), ("eval", (result["robustness"] or {}).get("records")))
        if there
    }


def _recipe(result: dict) -> tuple:
    return result["recipe"], tuple(result["overrides"])


def expand(paths: Iterable[Path]) -> List[Path]:
    """Result files named directly or found (``*.json``) in the folders named."""
    files = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            if not found:
                raise SystemExit(f"--merge {path}: no result files (*.json) in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise SystemExit(f"--merge {path}: no such file or folder")
    return files


def add(results: Sequence[tuple], folder: Path, budget: str) -> List[str]:
    """Put ``(origin, result)`` pairs into ``folder``, one file per preset and seed: a different file of the same
    run replaces the old one, unless it is the same training lacking a phase the old one has (a work dir whose eval
    was deleted). All must share the folder's recipe and overrides, so one table never mixes recipes; that is
    checked for all of them before anything is written. Returns one line per result."""
    present = {file_name(r["preset"], r["seed"]): r for r in load_all(folder, budget)}
    recipes = {_recipe(r) for r in present.values()}
    for origin, result in results:
        if recipes and _recipe(result) not in recipes:
            have = "; ".join(f"{name} {list(extra)}" for name, extra in sorted(recipes))
            raise SystemExit(
                f"{origin}: trained with {result['recipe']} {result['overrides']}, but {folder} holds "
                f"results of {have}; report it into another --out"
            )
        recipes.add(_recipe(result))
    lines = []
    for origin, result in results:
        key = file_name(result["preset"], result["seed"])
        old = present.get(key)
        if old == result:
            lines.append(f"{key}: unchanged")
            continue
        if old is not None and old["metrics"] == result["metrics"] and _phases(old) - _phases(result):
            lines.append(
                f"{key}: kept; the one from {origin} is the same training with less done "
                f"({', '.join(sorted(_phases(old) - _phases(result)))} missing)"
            )
            continue
        write(result, folder)
        present[key] = result
        lines.append(f"{key}: {'replaced' if old else 'added'} from {origin}")
    return lines


def merge(paths: Iterable[Path], folder: Path, budget: str) -> List[str]:
    """Result files (or folders of them) from other calls or machines into ``folder``; see ``add``."""
    return add([(path, read(path, budget)) for path in expand(paths)], folder, budget)


def load_all(folder: Path, budget: str) -> List[dict]:
    """Every result file in ``folder``."""
    return [read(p, budget) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
