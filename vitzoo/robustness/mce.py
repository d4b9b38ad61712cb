"""The corruption summaries as published: ImageNet-C's AlexNet-normalised CE and mCE (Hendrycks & Dietterich,
ICLR 2019) and CIFAR-10-C / CIFAR-100-C's mean corruption accuracy over 15 x 5 (as RobustBench reports it).

Each mean names the corruptions it went into; one over fewer than the 15 at severities 1-5 is labelled
"over k of 15" and never called mCE.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

from .corruptions import list_corruptions

__all__ = ["ALEXNET_ERR", "BENCHMARK", "SEVERITIES", "published", "coverage", "is_benchmark"]

BENCHMARK = tuple(list_corruptions("benchmark"))
SEVERITIES = (1, 2, 3, 4, 5)
# Top-1 error of AlexNet on ImageNet-C, mean over severities 1-5 (Hendrycks & Dietterich 2019; the values every
# ImageNet-C evaluation normalises by, e.g. AugMix's imagenet.py and mmpretrain's mCE metric).
ALEXNET_ERR = {
    "gaussian_noise": 0.886428,
    "shot_noise": 0.894468,
    "impulse_noise": 0.922640,
    "defocus_blur": 0.819880,
    "glass_blur": 0.826268,
    "motion_blur": 0.785948,
    "zoom_blur": 0.798360,
    "snow": 0.866816,
    "frost": 0.826572,
    "fog": 0.819324,
    "brightness": 0.564592,
    "contrast": 0.853204,
    "elastic_transform": 0.646056,
    "pixelate": 0.717840,
    "jpeg_compression": 0.606500,
}

Levels = Mapping[float, Mapping[str, Any]]  # severity -> record


def _full(levels: Levels) -> bool:
    return {int(s) for s in levels} >= set(SEVERITIES)


def is_benchmark(corruptions: Mapping[str, Levels]) -> bool:
    """Exactly the 15 benchmark corruptions, each at severities 1-5: what mCE and "15 x 5" mean."""
    return set(corruptions) == set(BENCHMARK) and all(_full(lv) for lv in corruptions.values())


def coverage(names: Sequence[str]) -> str:
    """How ``names`` relate to the 15: "the 15", "6 of 15", "6 of 15 + 2 extra"."""
    core = sum(n in BENCHMARK for n in names)
    extra = len(names) - core
    head = "the 15" if core == len(BENCHMARK) else f"{core} of 15"
    return head + (f" + {extra} extra" if extra else "")


def published(corruptions: Mapping[str, Levels], protocol: str) -> Dict[str, Any]:
    """The published summary of one checkpoint's corruption records (``{name: {severity: record}}``).

    Over the benchmark corruptions measured at all five severities (``corruptions``): ``mean_acc1``, their mean
    accuracy over corruptions x severities, which is RobustBench's mean corruption accuracy when all 15 are there
    (``mean_corruption_acc1``, else None). For the ImageNet protocol also ``alexnet_ce`` per corruption,
    CE_c = sum_s E_{s,c} / sum_s E^AlexNet_{s,c}, their mean ``alexnet_mean_ce`` and ``alexnet_mce`` (the mCE,
    only over the 15, else None). ``label`` says what the means are over.
    """
    full = [c for c in BENCHMARK if c in corruptions and _full(corruptions[c])]
    complete = len(full) == len(BENCHMARK)
    out: Dict[str, Any] = {
        "protocol": protocol,
        "corruptions": full,
        "severities": list(SEVERITIES),
        "label": "15 x 5" if complete else f"{len(full)} of 15 x 5",
    }
    if not full:
        return out
    errors = {c: [1 - corruptions[c][s]["acc1"] for s in sorted(corruptions[c]) if int(s) in SEVERITIES] for c in full}
    mean_acc = sum(1 - e for errs in errors.values() for e in errs) / (len(full) * len(SEVERITIES))
    out["mean_acc1"] = mean_acc
    out["mean_corruption_acc1"] = mean_acc if complete else None
    if protocol == "imagenet":
        ce = {c: sum(errs) / (len(SEVERITIES) * ALEXNET_ERR[c]) for c, errs in errors.items()}
        out["alexnet_ce"] = ce
        out["alexnet_mean_ce"] = sum(ce.values()) / len(ce)
        out["alexnet_mce"] = out["alexnet_mean_ce"] if complete else None
    return out
