"""Segmentation scores from a confusion matrix (rows: true class, columns: predicted class)."""
from __future__ import annotations

from typing import Dict

import torch

__all__ = ["segmentation_scores"]


def segmentation_scores(confusion: torch.Tensor) -> Dict[str, float]:
    """``miou`` (mean over the classes that occur in the labels or the predictions), ``iou_<c>`` per class
    (NaN for a class absent from both), ``pixel_acc`` and ``background_acc`` (the pixel accuracy of predicting
    class 0 everywhere: the baseline to beat); for 2 classes also ``fg_iou`` and ``fg_dice`` of class 1."""
    confusion = confusion.double()
    true_positive = confusion.diagonal()
    union = confusion.sum(0) + confusion.sum(1) - true_positive
    iou = true_positive / union  # NaN where a class is absent from both labels and predictions
    total = confusion.sum()
    scores = {"miou": float(iou.nanmean()), "pixel_acc": float(true_positive.sum() / total),
              "background_acc": float(confusion[0].sum() / total)}
    scores.update({f"iou_{c}": float(v) for c, v in enumerate(iou)})
    if len(confusion) == 2:
        denominator = confusion[1].sum() + confusion[:, 1].sum()
        scores.update(fg_iou=float(iou[1]), fg_dice=float(2 * true_positive[1] / denominator))
    return scores
