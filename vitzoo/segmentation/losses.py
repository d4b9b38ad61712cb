"""Segmentation losses by name (``module.loss``): torch's cross-entropy and segmentation_models_pytorch's Dice,
Focal and Lovász losses, with optional class weights (``module.class_weights``: a list, or ``balanced`` =
inverse pixel frequency of the training masks)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["LOSSES", "SegmentationLoss", "balanced_class_weights", "check_class_weights"]

LOSSES = ("ce", "dice", "focal", "lovasz", "ce+dice")


def balanced_class_weights(counts: np.ndarray, num_classes: int) -> list:
    """Inverse pixel frequency, ``total / (num_classes * pixels of c)`` (scikit-learn's "balanced": 1 for
    every class when they are equally frequent), from a histogram of class pixels (extra trailing entries,
    e.g. ignored pixels, are left out); a class without pixels gets weight 0."""
    pixels = np.asarray(counts[:num_classes], dtype=np.float64)
    safe = np.where(pixels > 0, pixels, 1.0)
    return np.where(pixels > 0, pixels.sum() / (num_classes * safe), 0.0).tolist()


def check_class_weights(class_weights, num_classes: int, loss: str) -> None:
    """One-line errors for a ``module.class_weights`` that cannot apply to ``module.loss``."""
    if class_weights is None:
        return
    if loss == "lovasz":
        raise ValueError(
            "module.loss=lovasz takes no class weights (smp's LovaszLoss has none); drop "
            "module.class_weights or pick module.loss=ce|dice|focal|ce+dice"
        )
    if isinstance(class_weights, str):
        if class_weights != "balanced":
            raise ValueError(
                f"module.class_weights={class_weights!r}; use balanced (inverse pixel frequency of the "
                f"training masks), a list of {num_classes} weights, or null"
            )
        return
    weights = list(class_weights)
    if len(weights) != num_classes or any(float(w) < 0 for w in weights):
        raise ValueError(
            f"module.class_weights={weights} needs {num_classes} non-negative weights, one per class "
            f"index (class 0 first), or balanced"
        )


class SegmentationLoss(nn.Module):
    """``(logits (B, C, H, W), masks (B, H, W) long) -> scalar``; pixels equal to ``ignore_index`` do not count.

    ``ce``: ``F.cross_entropy`` (weights scale each pixel's term by its class); ``dice``, ``focal``,
    ``lovasz``: smp's multiclass losses (a weighted mean of the per-class terms); ``ce+dice``: their sum.
    """

    def __init__(
        self,
        loss: str = "ce",
        num_classes: int = 2,
        ignore_index: int = 255,
        class_weights: Optional[Sequence[float]] = None,
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"module.loss={loss!r}; choose one of {'|'.join(LOSSES)}")
        check_class_weights(class_weights, num_classes, loss)
        if isinstance(class_weights, str):
            raise ValueError("resolve module.class_weights=balanced to a list (balanced_class_weights) first")
        from segmentation_models_pytorch import losses  # the seg extra

        weights = None if class_weights is None else [float(w) for w in class_weights]
        smp_losses = {
            "dice": lambda: losses.DiceLoss("multiclass", ignore_index=ignore_index, class_weights=weights),
            "focal": lambda: losses.FocalLoss("multiclass", ignore_index=ignore_index, class_weights=weights),
            "lovasz": lambda: losses.LovaszLoss("multiclass", ignore_index=ignore_index),
        }
        self.name, self.ignore_index, self.cross_entropy = loss, ignore_index, loss in ("ce", "ce+dice")
        self.register_buffer("weight", None if weights is None else torch.tensor(weights), persistent=False)
        self.terms = nn.ModuleList(smp_losses[term]() for term in loss.split("+") if term in smp_losses)

    def extra_repr(self) -> str:
        weights = "none" if self.weight is None else ", ".join(f"{w:.3g}" for w in self.weight.tolist())
        return f"{self.name}, class weights {weights}"

    def forward(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        total = sum(term(logits, masks) for term in self.terms)
        if self.cross_entropy:
            total = total + F.cross_entropy(logits, masks, weight=self.weight, ignore_index=self.ignore_index)
        return total
