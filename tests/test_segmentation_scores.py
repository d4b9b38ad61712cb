"""Segmentation scores per named class and the majority baseline, against values worked out by hand from
IoU = TP / (TP + FP + FN) and Dice = 2 TP / (2 TP + FP + FN); class names checked."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.classification import MulticlassConfusionMatrix, MulticlassF1Score, MulticlassJaccardIndex

from vitzoo.segmentation import SegmentationDataModule, segmentation_scores
from vitzoo.segmentation.labels import check_class_names
from vitzoo.segmentation.scores import format_scores

# rows: true class, columns: predicted class
CONFUSION = torch.tensor([[5, 1, 0], [2, 4, 1], [0, 3, 6]])
NAMES = ["membrane", "nucleus", "interior"]


def test_per_class_iou_and_dice_carry_the_class_names():
    scores = segmentation_scores(CONFUSION, NAMES)
    # membrane: TP 5, FN 1, FP 2; nucleus: TP 4, FN 3, FP 4; interior: TP 6, FN 3, FP 1
    expected = {
        "iou/membrane": 5 / 8,
        "iou/nucleus": 4 / 11,
        "iou/interior": 6 / 10,
        "dice/membrane": 10 / 13,
        "dice/nucleus": 8 / 15,
        "dice/interior": 12 / 16,
        "pixel_acc": 15 / 22,
        "miou": (5 / 8 + 4 / 11 + 6 / 10) / 3,
        "mdice": (10 / 13 + 8 / 15 + 12 / 16) / 3,
    }
    assert {key: scores[key] for key in expected} == pytest.approx(expected, rel=1e-12)
    assert not any(key.startswith(("fg_", "background", "iou_")) for key in scores)  # no unnamed headline


def test_majority_baseline_paints_the_most_frequent_true_class_everywhere():
    scores = segmentation_scores(CONFUSION, NAMES)
    # true pixels: membrane 6, nucleus 7, interior 9 of 22: interior everywhere is right on 9 pixels, and its
    # IoU is 9 / 22 (every pixel predicted interior), its Dice 2 * 9 / (9 + 22); the other classes score 0
    expected = {
        "majority/pixel_acc": 9 / 22,
        "majority/iou/interior": 9 / 22,
        "majority/dice/interior": 18 / 31,
        "majority/iou/membrane": 0.0,
        "majority/dice/membrane": 0.0,
        "majority/iou/nucleus": 0.0,
        "majority/dice/nucleus": 0.0,
        "majority/miou": 9 / 22 / 3,
        "majority/mdice": 18 / 31 / 3,
    }
    assert {key: scores[key] for key in expected} == pytest.approx(expected, rel=1e-12)
    # a binary mask that is 22% membrane: the do-nothing prediction already has 78% pixel accuracy
    binary = segmentation_scores(torch.tensor([[70, 8], [12, 10]]), ["interior", "membrane"])
    assert binary["majority/pixel_acc"] == pytest.approx(0.78) and binary["majority/iou/membrane"] == 0
    assert binary["pixel_acc"] == pytest.approx(0.80) and binary["iou/membrane"] == pytest.approx(10 / 30)
    tie = segmentation_scores(torch.tensor([[2, 0], [0, 2]]))
    assert tie["majority/iou/class_0"] == 0.5 and tie["majority/iou/class_1"] == 0  # a tie: the first class


def test_scores_match_torchmetrics_and_skip_absent_classes():
    torch.manual_seed(0)
    truth = torch.randint(0, 3, (4, 20, 20))
    truth[0, :5] = 255
    preds = torch.where(torch.rand(4, 20, 20) < 0.7, truth.clamp(max=2), torch.randint(0, 3, (4, 20, 20)))
    confusion = MulticlassConfusionMatrix(4, ignore_index=255)(preds, truth)  # class 3 occurs nowhere
    scores = segmentation_scores(confusion)
    iou = MulticlassJaccardIndex(4, average="none", ignore_index=255)(preds, truth)
    dice = MulticlassF1Score(4, average="none", ignore_index=255)(preds, truth)  # F1 of a class is its Dice
    assert [scores[f"iou/class_{c}"] for c in range(3)] == pytest.approx(iou[:3].tolist())
    assert [scores[f"dice/class_{c}"] for c in range(3)] == pytest.approx(dice[:3].tolist())
    assert math.isnan(scores["iou/class_3"]) and math.isnan(scores["dice/class_3"])
    assert scores["miou"] == pytest.approx(float(iou[:3].mean())) and scores["mdice"] == pytest.approx(
        float(dice[:3].mean())
    )


def test_format_scores_names_every_class_beside_its_baseline():
    text = format_scores(segmentation_scores(CONFUSION, NAMES))
    assert text == (
        "IoU / Dice (in brackets: interior everywhere): membrane 0.625 / 0.769 (0.000 / 0.000), "
        "nucleus 0.364 / 0.533 (0.000 / 0.000), interior 0.600 / 0.750 (0.409 / 0.581); "
        "mean 0.530 / 0.684 (0.136 / 0.194); pixel accuracy 0.682 (0.409)"
    )


@pytest.mark.parametrize(
    "names,message",
    [
        (
            ["interior", "membrane", "extra"],
            r"^data.class_names has 3 name\(s\) \['interior', 'membrane', 'extra'\] but "
            r"data.num_classes=2; give one name per class index 0..1 \(class 0 first\)$",
        ),
        (
            "interior,membrane",
            r"^data.class_names='interior,membrane' is not a list; .*"
            r"data.class_names=\[name_0,name_1\]$",
        ),
        (["interior", "interior"], "names 'interior' twice"),
        (["cell interior", "membrane"], r"holds 'cell interior'; use letters, digits.*\(e.g. cell_interior\)$"),
    ],
)
def test_bad_class_names_are_one_line_errors_naming_the_fix(names, message, tmp_path):
    with pytest.raises(ValueError, match=message) as err:
        check_class_names(names, 2)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message):  # data.class_names is checked when the data module is built
        SegmentationDataModule(tmp_path, num_classes=2, class_names=names)


def test_class_names_default_and_pass_through():
    assert check_class_names(None, 3) == ("class_0", "class_1", "class_2")
    assert check_class_names(["interior", "membrane"], 2) == ("interior", "membrane")
