"""Robustness results: summary metrics, JSON/CSV files, plots and TensorBoard scalars.

A record is one pass of one checkpoint: ``{"checkpoint", "test", "level", "acc1", "acc5", "loss",
"num_images"}`` with ``test`` one of ``clean``, a corruption name, ``logit_noise`` (level = sigma)
or ``resolution`` (level = image size in pixels).
"""
from __future__ import annotations

import csv
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from vitzoo.training import write_json

from .corruptions import CORRUPTIONS
from .sweep import CLEAN, LOGIT_NOISE, RESOLUTION

__all__ = ["summarize", "write_results", "plot_results", "log_tensorboard", "RECORD_FIELDS"]

RECORD_FIELDS = ("checkpoint", "test", "level", "acc1", "acc5", "loss", "num_images", "entropy")


def _by_checkpoint(records: Sequence[dict]) -> Dict[str, Dict[str, Dict[float, dict]]]:
    out: Dict[str, Dict[str, Dict[float, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        out[r["checkpoint"]][r["test"]][r["level"]] = r
    return out


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den > 0 else None


def summarize(records: Sequence[dict], baseline: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """Per checkpoint: clean accuracy, accuracy per corruption (mean over severities), the mean corrupted
    accuracy and its relative drop from clean, accuracy per logit sigma and per resolution.

    With ``baseline`` (a checkpoint label): Hendrycks & Dietterich's corruption error
    CE_c = sum_s E_{c,s} / sum_s E^base_{c,s}, its mean ``mCE`` and the relative mCE
    (errors minus the clean error, in both numerator and denominator); 1.0 = as robust as the baseline.
    """
    table = _by_checkpoint(records)
    if baseline is not None and baseline not in table:
        raise ValueError(f"baseline {baseline!r} is not among the evaluated checkpoints {sorted(table)}")
    out: Dict[str, Dict[str, Any]] = {}
    for label, tests in table.items():
        clean = tests[CLEAN][0]["acc1"]
        corruptions = {t: levels for t, levels in tests.items() if t in CORRUPTIONS}
        corrupted = [r["acc1"] for levels in corruptions.values() for r in levels.values()]
        s: Dict[str, Any] = {"clean_acc1": clean}
        if corrupted:
            mean = sum(corrupted) / len(corrupted)
            s["corruption_acc1"] = {t: sum(r["acc1"] for r in lv.values()) / len(lv) for t, lv in corruptions.items()}
            s["mean_corrupted_acc1"] = mean
            s["relative_drop"] = _ratio(clean - mean, clean)
        if LOGIT_NOISE in tests:
            s["logit_noise_acc1"] = {f"{lv:g}": r["acc1"] for lv, r in sorted(tests[LOGIT_NOISE].items())}
        if RESOLUTION in tests:
            s["resolution_acc1"] = {f"{lv:g}": r["acc1"] for lv, r in sorted(tests[RESOLUTION].items())}
        out[label] = s
    if baseline is not None:
        for label, tests in table.items():
            out[label].update(_corruption_errors(tests, table[baseline]))
    return out


def _corruption_errors(tests: Dict[str, Dict[float, dict]], base: Dict[str, Dict[float, dict]]) -> Dict[str, Any]:
    clean_err, base_clean_err = 1 - tests[CLEAN][0]["acc1"], 1 - base[CLEAN][0]["acc1"]
    ce, rel = {}, {}
    for name, levels in tests.items():
        if name not in CORRUPTIONS or name not in base:
            continue
        shared = [lv for lv in levels if lv in base[name]]
        err = [1 - levels[lv]["acc1"] for lv in shared]
        base_err = [1 - base[name][lv]["acc1"] for lv in shared]
        ce[name] = _ratio(sum(err), sum(base_err))
        rel[name] = _ratio(sum(e - clean_err for e in err), sum(e - base_clean_err for e in base_err))

    def mean(values: Dict[str, Optional[float]]) -> Optional[float]:
        known = [v for v in values.values() if v is not None]
        return sum(known) / len(known) if known and len(known) == len(values) else None

    return {"ce": ce, "mce": mean(ce), "relative_ce": rel, "relative_mce": mean(rel)}


def write_results(records: Sequence[dict], summary: Dict[str, Any], out_dir: Path, meta: Dict[str, Any]) -> None:
    """``robustness.json`` (meta, per-checkpoint summary, records) and ``robustness.csv`` (records)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "robustness.json", {**meta, "summary": summary, "records": list(records)})
    with open(out_dir / "robustness.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RECORD_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)


def plot_results(records: Sequence[dict], out_dir: Path, train_sizes: Dict[str, int]) -> List[Path]:
    """PNG plots, one line per checkpoint: accuracy vs severity per corruption (``corruptions.png``),
    vs logit sigma (``logit_noise.png``), vs image size (``resolution.png``). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cycler import cycler

    # 20 distinguishable lines: the 10 default colours solid, then dashed (a zoo sweep has 16 checkpoints)
    lines = cycler(linestyle=["-", "--"]) * cycler(color=plt.get_cmap("tab10").colors)
    with plt.rc_context({"axes.prop_cycle": lines}):
        return _plot_tables(_by_checkpoint(records), out_dir, train_sizes)


def _plot_tables(table: dict, out_dir: Path, train_sizes: Dict[str, int]) -> List[Path]:
    import matplotlib.pyplot as plt

    labels = list(table)
    written = []
    corruption_names = sorted({t for tests in table.values() for t in tests if t in CORRUPTIONS})
    if corruption_names:
        cols = min(4, len(corruption_names))
        rows = math.ceil(len(corruption_names) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(max(6.5, 3.6 * cols), 3.0 * rows + 0.6), squeeze=False,
                                 sharey=True)
        for ax, name in zip(axes.flat, corruption_names):
            for label in labels:
                levels = table[label].get(name, {})
                xs = [0] + sorted(levels)
                ys = [table[label][CLEAN][0]["acc1"]] + [levels[x]["acc1"] for x in xs[1:]]
                ax.plot(xs, ys, marker="o", label=label)
            ax.set(title=name, xlabel="severity (0 = clean)", xticks=range(6))
            ax.grid(alpha=0.3)
        for ax in axes[:, 0]:
            ax.set_ylabel("top-1 accuracy")
        for ax in list(axes.flat)[len(corruption_names):]:
            ax.axis("off")
        written.append(_save(fig, axes.flat[0], out_dir / "corruptions.png"))
    if any(LOGIT_NOISE in t for t in table.values()):
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for label in labels:
            levels = table[label].get(LOGIT_NOISE, {})
            xs = sorted(levels)
            ax.plot(xs, [levels[x]["acc1"] for x in xs], marker="o", label=label)
        sigmas = sorted({x for t in table.values() for x in t.get(LOGIT_NOISE, {})})
        ax.set_xscale("symlog", linthresh=max(min([x for x in sigmas if x > 0], default=1.0), 1e-3))
        ax.set_xticks(sigmas, [f"{x:g}" for x in sigmas])
        ax.minorticks_off()
        ax.set(xlabel="logit noise sigma (every attention layer, eval time)", ylabel="top-1 accuracy",
               title="attention-logit noise")
        ax.grid(alpha=0.3)
        written.append(_save(fig, ax, out_dir / "logit_noise.png"))
    if any(RESOLUTION in t for t in table.values()):
        keys = ["acc1"] + (["entropy"] if all("entropy" in r for t in table.values() for r in t[CLEAN].values())
                           else [])
        fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.2), squeeze=False)
        for ax, key in zip(axes[0], keys):
            for label in labels:
                levels = table[label].get(RESOLUTION, {})
                points = {train_sizes[label]: table[label][CLEAN][0][key], **{x: r[key] for x, r in levels.items()}}
                xs = sorted(points)
                ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
            ax.set(xlabel="input size (px; the training size is the clean point)",
                   ylabel="top-1 accuracy" if key == "acc1" else "attention entropy H / log n (mean over layers)",
                   title="resolution" if key == "acc1" else "attention entropy vs resolution")
            ax.grid(alpha=0.3)
        written.append(_save(fig, axes[0, 0], out_dir / "resolution.png"))
    return written


def _save(fig, legend_ax, path: Path) -> Path:
    import matplotlib.pyplot as plt

    handles, names = legend_ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * math.ceil(len(names) / 4), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long legends may be wider than the axes
    plt.close(fig)
    return path


def log_tensorboard(records: Sequence[dict], log_dir: Path) -> None:
    """Scalars per checkpoint (one TensorBoard run each, so curves overlay): ``clean/acc1``,
    ``corruption/<name>`` (step = severity), ``logit_noise/acc1`` (step = 100 * sigma),
    ``resolution/acc1`` and ``resolution/entropy`` (step = image size)."""
    from torch.utils.tensorboard import SummaryWriter

    for label, tests in _by_checkpoint(records).items():
        with SummaryWriter(str(log_dir / _safe(label))) as writer:
            for test, levels in tests.items():
                for level, r in sorted(levels.items()):
                    if test == CLEAN:
                        writer.add_scalar("clean/acc1", r["acc1"], 0)
                    elif test == LOGIT_NOISE:
                        writer.add_scalar("logit_noise/acc1", r["acc1"], int(round(100 * level)))
                    elif test == RESOLUTION:
                        writer.add_scalar("resolution/acc1", r["acc1"], int(level))
                        if "entropy" in r:
                            writer.add_scalar("resolution/entropy", r["entropy"], int(level))
                    else:
                        writer.add_scalar(f"corruption/{test}", r["acc1"], int(level))


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", label).strip("_") or "checkpoint"
