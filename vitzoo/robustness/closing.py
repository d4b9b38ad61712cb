"""What eval.py says at its end: one row of accuracies per checkpoint, then where every file went."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .intervals import accuracy_interval
from .report import by_checkpoint
from .sweep import ADVERSARIAL, CLEAN, LOGIT_NOISE, RESOLUTION

__all__ = ["results_table", "file_lines"]

Column = Tuple[str, str, Dict[str, str]]  # (group, header, cell per checkpoint)


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _columns(
    records: Sequence[dict],
    summary: Dict[str, dict],
    baseline: Optional[str],
    factors: Sequence[float],
    sizes: Dict[str, List[int]],
) -> List[Column]:
    table = by_checkpoint(records)
    columns: List[Column] = [("", "clean", {lb: _pct(t[CLEAN][0]["acc1"]) for lb, t in table.items()})]
    swept = next((s for s in summary.values() if "mean_corrupted_acc1" in s), None)
    if swept is not None:
        scope = _scope(swept)
        columns.append(
            ("corruptions", f"mean {scope}", {lb: _pct(summary[lb].get("mean_corrupted_acc1")) for lb in table})
        )
        ce = "mCE" if swept["benchmark"] else f"mean CE {scope}"
        columns.append(
            (
                "corruptions",
                f"{ce} vs {baseline}" if baseline is not None else ce,
                {lb: _pct(summary[lb].get("mce")) for lb in table},
            )
        )
        alexnet = [s["published"] for s in summary.values() if "alexnet_mean_ce" in s.get("published", {})]
        if alexnet:
            header = (
                "mCE AlexNet"
                if alexnet[0]["alexnet_mce"] is not None
                else f"mean CE AlexNet {len(alexnet[0]['corruptions'])} of 15"
            )
            columns.append(
                (
                    "corruptions",
                    header,
                    {lb: _pct(summary[lb].get("published", {}).get("alexnet_mean_ce")) for lb in table},
                )
            )
    for sigma in sorted({s for t in table.values() for s in t.get(LOGIT_NOISE, {}) if s > 0}):
        columns.append(
            (
                "logit noise",
                f"{sigma:g}",
                {lb: _pct(t.get(LOGIT_NOISE, {}).get(sigma, {}).get("acc1")) for lb, t in table.items()},
            )
        )
    radii = sorted({e for t in table.values() for e in t.get(ADVERSARIAL, {})})
    for group, key in (("PGD L-inf", "acc1"), ("AutoAttack L-inf", "autoattack_acc1")):
        if any(key in r for t in table.values() for r in t.get(ADVERSARIAL, {}).values()):
            columns += [
                (
                    group,
                    f"{eps:g}/255",
                    {lb: _pct(t.get(ADVERSARIAL, {}).get(eps, {}).get(key)) for lb, t in table.items()},
                )
                for eps in radii
            ]
    for i, factor in enumerate(factors):
        columns.append(
            (
                "input size",
                f"{factor:g}x",
                {lb: _pct(t.get(RESOLUTION, {}).get(sizes[lb][i], {}).get("acc1")) for lb, t in table.items()},
            )
        )
    return columns


def _scope(summary: dict) -> str:
    """What a checkpoint's corruption means are over, in a header: "15x5" for the 15 at severities 1-5, else e.g.
    "6 of 15+2" (6 of the 15 and 2 extra corruptions)."""
    if summary["benchmark"]:
        return "15x5"
    return summary["over"].replace("the 15", "15 of 15").replace(" + ", "+").replace(" extra", "")


def _render(labels: Sequence[str], columns: List[Column]) -> List[str]:
    """Two header lines (groups over their columns, then the columns), then one line per checkpoint."""
    widths = [max(len(header), *(len(cells[lb]) for lb in labels)) for _, header, cells in columns]
    groups: List[Tuple[str, List[int]]] = []
    for i, (group, _, _) in enumerate(columns):
        if groups and groups[-1][0] == group:
            groups[-1][1].append(i)
        else:
            groups.append((group, [i]))
    for group, members in groups:  # a group name wider than its columns widens them evenly
        missing = len(group) - (sum(widths[i] for i in members) + 2 * (len(members) - 1))
        for k, i in enumerate(members):
            widths[i] += max(0, missing + k) // len(members)
    first = max(len("checkpoint"), *map(len, labels))
    over = " " * first + "".join(
        "  " + group.ljust(sum(widths[i] for i in members) + 2 * (len(members) - 1)) for group, members in groups
    )
    lines = [over.rstrip()] if over.strip() else []
    lines.append("checkpoint".ljust(first) + "".join(f"  {h:>{w}}" for (_, h, _), w in zip(columns, widths)))
    lines += [
        lb.ljust(first) + "".join(f"  {cells[lb]:>{w}}" for (_, _, cells), w in zip(columns, widths)) for lb in labels
    ]
    return lines


def results_table(
    records: Sequence[dict],
    summary: Dict[str, dict],
    baseline: Optional[str],
    data: str,
    factors: Sequence[float],
    sizes: Dict[str, List[int]],
) -> List[str]:
    """The closing table: a heading (data set, images per pass, the widest 95% interval), one row per checkpoint
    (clean, mean corrupted and mCE, accuracy per logit sigma > 0, per attack radius and per resolution factor, in
    %), what mCE and
    the column groups mean. ``sizes[label][i]`` is the pixel size of ``factors[i]`` for that checkpoint."""
    num_images = sorted({r["num_images"] for r in records})
    count = f"{num_images[0]:,}" if len(num_images) == 1 else f"{num_images[0]:,}-{num_images[-1]:,}"
    half = max((hi - lo) / 2 for lo, hi in (accuracy_interval(r["acc1"], r["num_images"]) for r in records))
    columns = _columns(records, summary, baseline, factors, sizes)
    lines = [
        f"top-1 accuracy (%) on the {data}, {count} images per pass (95% Wilson interval of a pass: "
        f"+-{100 * half:.1f} points at most)",
        *_render(list(by_checkpoint(records)), columns),
    ]
    groups = {group for group, _, _ in columns}
    if "corruptions" in groups:
        lines += _corruption_notes(records, next(s for s in summary.values() if "mean_corrupted_acc1" in s), baseline)
    if "logit noise" in groups:
        lines.append(
            "logit noise: accuracy at sigma, N(0, sigma^2) added to every attention layer's logits (sigma 0 = clean)"
        )
    if "PGD L-inf" in groups:
        lines.append(
            "PGD L-inf: accuracy under PGD (10 steps of 2.5 eps / 10, random start) at eps in grey levels "
            "of a [0, 1] image; FGSM's in robustness.json / .csv (fgsm_acc1)"
        )
    if "AutoAttack L-inf" in groups:
        lines.append(
            "AutoAttack L-inf: accuracy under AutoAttack's standard set (APGD-CE, APGD-T, FAB-T, Square; "
            "torchattacks) at the same eps"
        )
    if "input size" in groups:
        lines.append("input size: factor of each checkpoint's training size")
    return lines


def _corruption_notes(records: Sequence[dict], swept: dict, baseline: Optional[str]) -> List[str]:
    """What the corruption columns are over and what they mean."""
    severities = sorted({int(r["level"]) for r in records if r["test"] in swept["corruptions"]})
    what = (
        "the 15 x 5 (CIFAR-C's mean corruption accuracy as RobustBench reports it)"
        if swept["benchmark"]
        else f"{swept['over']} at severities {','.join(map(str, severities))}: not the 15 x 5"
    )
    lines = [f"corruptions: mean = accuracy over {', '.join(swept['corruptions'])} x severities ({what})"]
    ce = "mCE" if swept["benchmark"] else "mean CE (not mCE, which needs the 15 at severities 1-5)"
    lines.append(
        f"  {ce} vs {baseline} = corruption error in % of the baseline's (Hendrycks & Dietterich; "
        f"100 = as robust, lower is better)"
        if baseline is not None
        else f"  {ce.split(' (')[0]} needs a baseline (robustness.baseline=<label or .ckpt>)"
    )
    published = swept.get("published", {})
    if "alexnet_mean_ce" in published:
        over = (
            "the 15"
            if published["alexnet_mce"] is not None
            else f"{', '.join(published['corruptions'])} ({len(published['corruptions'])} of 15; not mCE)"
        )
        lines.append(f"  CE AlexNet = ImageNet-C corruption error in % of AlexNet's published errors, mean over {over}")
    return lines


def file_lines(out_dir: Path, results: Sequence[Path], plots: Sequence[Path], tensorboard: Optional[Path]) -> List[str]:
    """Where the files went: the run directory (absolute), then results, plots, TensorBoard and the log (relative
    to it; absolute when elsewhere)."""
    run = out_dir.resolve()

    def show(paths: Sequence[Path]) -> str:
        return ", ".join(
            str(p.resolve().relative_to(run)) if p.resolve().is_relative_to(run) else str(p.resolve()) for p in paths
        )

    logs = [Path(h.baseFilename) for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    lines = [f"run directory: {run}", f"  results: {show(results)}"]
    if plots:
        lines.append(f"  plots: {show(plots)}")
    if tensorboard is not None:
        lines.append(f"  tensorboard: {show([tensorboard])} (tensorboard --logdir {tensorboard.resolve()})")
    if logs:
        lines.append(f"  log: {show(logs)}")
    return lines
