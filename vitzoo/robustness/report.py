"""Robustness results: summary metrics, JSON/CSV files and TensorBoard scalars (the plots: ``plots``).

A record is one pass of one checkpoint: ``{"checkpoint", "test", "level", "acc1", "acc5", "loss",
"num_images"}`` with ``test`` one of ``clean``, a corruption name, ``logit_noise`` (level = sigma)
``resolution`` (level = image size in pixels) or ``pgd_linf`` (level = eps in grey levels of 255; ``acc1`` under
PGD, ``fgsm_acc1``, and ``autoattack_acc1`` when robustness.attack=autoattack ran).
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from vitzoo.utils import write_json

from .adversarial import ATTACK_SETS
from .corruptions import CORRUPTIONS
from .mce import coverage, is_benchmark, published
from .sweep import ADVERSARIAL, CLEAN, LOGIT_NOISE, RESOLUTION

__all__ = ["summarize", "write_results", "log_tensorboard", "by_checkpoint", "RECORD_FIELDS"]

RECORD_FIELDS = (
    "checkpoint",
    "test",
    "level",
    "acc1",
    "acc5",
    "loss",
    "num_images",
    "entropy",
    "fgsm_acc1",
    "autoattack_acc1",
)


def by_checkpoint(records: Sequence[dict]) -> Dict[str, Dict[str, Dict[float, dict]]]:
    """``{checkpoint: {test: {level: record}}}``, checkpoints in the order of their first record."""
    out: Dict[str, Dict[str, Dict[float, dict]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        out[r["checkpoint"]][r["test"]][r["level"]] = r
    return out


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den > 0 else None


def summarize(
    records: Sequence[dict], baseline: Optional[str] = None, protocols: Optional[Dict[str, str]] = None
) -> Dict[str, Dict[str, Any]]:
    """Per checkpoint: clean accuracy, accuracy per corruption (mean over severities), the mean corrupted
    accuracy and its relative drop from clean, accuracy per logit sigma and per resolution; ``corruptions``
    names what the corruption means are over and ``over`` how that relates to the 15 ("the 15", "6 of 15 + 2
    extra"), ``benchmark`` whether it is the 15 at severities 1-5.

    With ``baseline`` (a checkpoint label): Hendrycks & Dietterich's corruption error
    CE_c = sum_s E_{c,s} / sum_s E^base_{c,s}, the mean of those (``mce``, an mCE only when ``benchmark``)
    and of the relative CEs (errors minus the clean error, in both numerator and denominator); 1.0 = as robust
    as the baseline. With ``protocols`` (label -> "cifar" | "imagenet"): ``published``, the summaries as
    published (``mce.published``: CIFAR's mean corruption accuracy, ImageNet-C's AlexNet-normalised mCE).
    """
    table = by_checkpoint(records)
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
            s["corruptions"], s["over"] = list(corruptions), coverage(list(corruptions))
            s["benchmark"] = is_benchmark(corruptions)
            if protocols is not None and label in protocols:
                s["published"] = published(corruptions, protocols[label])
        if LOGIT_NOISE in tests:
            s["logit_noise_acc1"] = {f"{lv:g}": r["acc1"] for lv, r in sorted(tests[LOGIT_NOISE].items())}
        if RESOLUTION in tests:
            s["resolution_acc1"] = {f"{lv:g}": r["acc1"] for lv, r in sorted(tests[RESOLUTION].items())}
        if ADVERSARIAL in tests:
            levels = sorted(tests[ADVERSARIAL].items())
            s["pgd_linf_acc1"] = {f"{lv:g}/255": r["acc1"] for lv, r in levels}
            autoattack = all("autoattack_acc1" in r for _, r in levels)
            if autoattack:
                s["autoattack_linf_acc1"] = {f"{lv:g}/255": r["autoattack_acc1"] for lv, r in levels}
            s["attack_set"] = ATTACK_SETS["autoattack" if autoattack else "pgd"]
            s["attack_check"] = _attack_check(clean, tests[ADVERSARIAL])
        out[label] = s
    if baseline is not None:
        for label, tests in table.items():
            out[label].update(_corruption_errors(tests, table[baseline]))
    return out


def _attack_check(clean: float, levels: Dict[float, dict]) -> str:
    """ "ok", or which guard a silently broken attack failed: an accuracy under attack above clean, PGD above FGSM
    or AutoAttack above PGD at the same eps (one image of slack for the random starts)."""
    for eps, r in sorted(levels.items()):
        slack = 1 / r["num_images"]
        attacked = max(r["acc1"], r["fgsm_acc1"], r.get("autoattack_acc1", 0.0))
        if attacked > clean + slack:
            return f"failed: accuracy under attack at {eps:g}/255 above clean ({attacked:.3f} > {clean:.3f})"
        if r["acc1"] > r["fgsm_acc1"] + slack:
            return f"failed: PGD above FGSM at {eps:g}/255 ({r['acc1']:.3f} > {r['fgsm_acc1']:.3f})"
        if r.get("autoattack_acc1", 0.0) > r["acc1"] + slack:
            return f"failed: AutoAttack above PGD at {eps:g}/255 ({r['autoattack_acc1']:.3f} > {r['acc1']:.3f})"
    return "ok"


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


def log_tensorboard(records: Sequence[dict], log_dir: Path) -> None:
    """Scalars per checkpoint (one TensorBoard run each, so curves overlay): ``clean/acc1``,
    ``corruption/<name>`` (step = severity), ``logit_noise/acc1`` (step = 100 * sigma),
    ``resolution/acc1`` and ``resolution/entropy`` (step = image size), ``pgd_linf/acc1``, ``fgsm_linf/acc1`` and
    ``autoattack_linf/acc1`` (step = eps in grey levels of 255)."""
    from torch.utils.tensorboard import SummaryWriter

    for label, tests in by_checkpoint(records).items():
        with SummaryWriter(str(log_dir / _safe(label))) as writer:
            for test, levels in tests.items():
                for level, r in sorted(levels.items()):
                    if test == CLEAN:
                        writer.add_scalar("clean/acc1", r["acc1"], 0)
                    elif test == LOGIT_NOISE:
                        writer.add_scalar("logit_noise/acc1", r["acc1"], int(round(100 * level)))
                    elif test == ADVERSARIAL:
                        writer.add_scalar("pgd_linf/acc1", r["acc1"], int(level))
                        writer.add_scalar("fgsm_linf/acc1", r["fgsm_acc1"], int(level))
                        if "autoattack_acc1" in r:
                            writer.add_scalar("autoattack_linf/acc1", r["autoattack_acc1"], int(level))
                    elif test == RESOLUTION:
                        writer.add_scalar("resolution/acc1", r["acc1"], int(level))
                        if "entropy" in r:
                            writer.add_scalar("resolution/entropy", r["entropy"], int(level))
                    else:
                        writer.add_scalar(f"corruption/{test}", r["acc1"], int(level))


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", label).strip("_") or "checkpoint"
