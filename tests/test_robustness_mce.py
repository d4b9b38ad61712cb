"""The corruption summaries as published: ImageNet-C's AlexNet-normalised CE / mCE, CIFAR-C's 15 x 5 mean accuracy,
checked against values computed by hand from the formula CE_c = sum_s E_{s,c} / sum_s E^AlexNet_{s,c}."""

from __future__ import annotations

import pytest

from vitzoo.robustness import list_corruptions, summarize
from vitzoo.robustness.closing import results_table
from vitzoo.robustness.mce import ALEXNET_ERR, published


def _levels(errors):
    return {s: {"acc1": 1 - e} for s, e in enumerate(errors, 1)}


def test_alexnet_ce_of_two_corruptions_by_hand_and_not_called_mce():
    corruptions = {
        "gaussian_noise": _levels([0.2, 0.3, 0.4, 0.5, 0.6]),
        "contrast": _levels([0.1, 0.1, 0.2, 0.2, 0.4]),
        "fog": {1: {"acc1": 0.5}, 3: {"acc1": 0.4}},
    }  # not at all five severities: left out
    out = published(corruptions, "imagenet")
    # AlexNet's published errors (mean over severities): Gaussian noise 0.886428, contrast 0.853204.
    ce_noise = (0.2 + 0.3 + 0.4 + 0.5 + 0.6) / (5 * 0.886428)  # 2.0 / 4.43214 = 0.45125
    ce_contrast = (0.1 + 0.1 + 0.2 + 0.2 + 0.4) / (5 * 0.853204)  # 1.0 / 4.26602 = 0.23441
    assert ce_noise == pytest.approx(0.451249, abs=1e-6) and ce_contrast == pytest.approx(0.234411, abs=1e-6)
    assert out["alexnet_ce"] == pytest.approx({"gaussian_noise": ce_noise, "contrast": ce_contrast}, rel=1e-12)
    assert out["alexnet_mean_ce"] == pytest.approx((ce_noise + ce_contrast) / 2, rel=1e-12)
    assert out["alexnet_mce"] is None and out["label"] == "2 of 15 x 5"  # over 2 of 15: never called mCE
    assert out["corruptions"] == ["contrast", "gaussian_noise"]
    assert out["mean_acc1"] == pytest.approx(1 - 3.0 / 10) and out["mean_corruption_acc1"] is None
    assert "alexnet_ce" not in published(corruptions, "cifar")  # AlexNet's errors are ImageNet-C's


def test_the_15_at_five_severities_give_the_mce_and_robustbench_mean():
    names = list_corruptions("benchmark")
    assert sorted(ALEXNET_ERR) == names
    # the table's checksum: its 15 published errors add up to 11.834896 (two of them are checked by hand above)
    assert sum(ALEXNET_ERR.values()) == pytest.approx(11.834896, abs=1e-9)
    half = {n: _levels([ALEXNET_ERR[n] / 2] * 5) for n in names}  # half AlexNet's error everywhere: mCE = 0.5
    out = published(half, "imagenet")
    assert out["label"] == "15 x 5" and out["alexnet_mce"] == pytest.approx(0.5, rel=1e-12)
    assert out["mean_acc1"] == pytest.approx(1 - 11.834896 / 2 / 15, rel=1e-12)
    own = published({n: _levels([ALEXNET_ERR[n]] * 5) for n in names}, "imagenet")
    assert own["alexnet_mce"] == pytest.approx(1.0, rel=1e-12)  # AlexNet against itself: 100%
    cifar = published(half, "cifar")
    assert cifar["mean_corruption_acc1"] == pytest.approx(out["mean_acc1"]) and "alexnet_mce" not in cifar


def _records(label, clean, corruptions, severities=(1, 2, 3, 4, 5), acc=0.5):
    out = [{"checkpoint": label, "test": "clean", "level": 0, "acc1": clean, "num_images": 100}]
    return out + [
        {"checkpoint": label, "test": c, "level": s, "acc1": acc, "num_images": 100}
        for c in corruptions
        for s in severities
    ]


def test_summary_and_table_name_what_each_mean_is_over():
    some = ["gaussian_noise", "contrast", "speckle_noise"]  # 2 of the 15 and an extra
    records = _records("a", 0.9, some) + _records("b", 0.8, some, acc=0.4)
    summary = summarize(records, "a", {"a": "imagenet", "b": "imagenet"})
    assert summary["a"]["corruptions"] == some and summary["a"]["over"] == "2 of 15 + 1 extra"
    assert summary["a"]["benchmark"] is False and summary["a"]["published"]["corruptions"] == [
        "contrast",
        "gaussian_noise",
    ]
    lines = results_table(records, summary, "a", "x", [], {})
    assert lines[2].split() == [
        "checkpoint",
        "clean",
        "mean",
        "2",
        "of",
        "15+1",
        "mean",
        "CE",
        "2",
        "of",
        "15+1",
        "vs",
        "a",
        "mean",
        "CE",
        "AlexNet",
        "2",
        "of",
        "15",
    ]
    assert "mCE" not in " ".join(lines[:5])
    assert (
        lines[5] == "corruptions: mean = accuracy over gaussian_noise, contrast, speckle_noise x severities "
        "(2 of 15 + 1 extra at severities 1,2,3,4,5: not the 15 x 5)"
    )
    assert lines[6].startswith("  mean CE (not mCE, which needs the 15 at severities 1-5) vs a = ")
    assert (
        lines[7] == "  CE AlexNet = ImageNet-C corruption error in % of AlexNet's published errors, mean over "
        "contrast, gaussian_noise (2 of 15; not mCE)"
    )

    every = list_corruptions("benchmark")
    records = _records("a", 0.9, every) + _records("b", 0.8, every, acc=0.4)
    summary = summarize(records, "a", {"a": "imagenet", "b": "imagenet"})
    assert summary["b"]["benchmark"] is True and summary["b"]["over"] == "the 15"
    lines = results_table(records, summary, "a", "x", [], {})
    assert lines[2].split() == ["checkpoint", "clean", "mean", "15x5", "mCE", "vs", "a", "mCE", "AlexNet"]
    alexnet_mce = summary["b"]["published"]["alexnet_mce"]
    assert lines[4].split() == ["b", "80.0", "40.0", f"{100 * 0.6 / 0.5:.1f}", f"{100 * alexnet_mce:.1f}"]
