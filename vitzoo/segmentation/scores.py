"""Segmentation scores from a confusion matrix (rows: true class, columns: predicted class), per named class,
beside the scores of the trivial prediction that paints every pixel with the most frequent true class."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch

from .labels import check_class_names

__all__ = ["segmentation_scores", "format_scores"]


def _scores(confusion: torch.Tensor, names: Sequence[str], prefix: str = "") -> Dict[str, float]:
    true_positive = confusion.diagonal()
    truth, predicted = confusion.sum(1), confusion.sum(0)
    iou = true_positive / (truth + predicted - true_positive)  # NaN where a class is absent from both
    dice = 2 * true_positive / (truth + predicted)
    scores = {
        f"{prefix}pixel_acc": float(true_positive.sum() / confusion.sum()),
        f"{prefix}miou": float(iou.nanmean()),
        f"{prefix}mdice": float(dice.nanmean()),
    }
    scores.update({f"{prefix}iou/{name}": float(v) for name, v in zip(names, iou)})
    scores.update({f"{prefix}dice/{name}": float(v) for name, v in zip(names, dice)})
    return scores


def segmentation_scores(confusion: torch.Tensor, class_names: Optional[Sequence[str]] = None) -> Dict[str, float]:
    """Per class ``c`` (named ``class_names[c]``, default ``class_<c>``), with TP, FP, FN its pixel counts:
    ``iou/<name>`` = TP / (TP + FP + FN) and ``dice/<name>`` = 2 TP / (2 TP + FP + FN), NaN for a class absent
    from both labels and predictions; ``miou`` / ``mdice`` their means over the other classes; ``pixel_acc``.

    The same keys under ``majority/`` score the trivial prediction of the most frequent true class everywhere
    (``majority/pixel_acc`` is that class's share of the pixels): the baseline each score has to beat."""
    names = check_class_names(class_names, len(confusion))
    confusion = confusion.double()
    majority = torch.zeros_like(confusion)
    majority[:, int(confusion.sum(1).argmax())] = confusion.sum(1)
    return {**_scores(confusion, names), **_scores(majority, names, "majority/")}


def format_scores(scores: Dict[str, float]) -> str:
    """``segmentation_scores`` in one line, each class by name, the majority baseline in brackets: ``IoU / Dice
    (in brackets: interior everywhere): membrane 0.612 / 0.759 (0.000 / 0.000), interior ...; mean ...; pixel
    accuracy 0.901 (0.781)``."""
    names = [key[len("iou/") :] for key in scores if key.startswith("iou/")]
    majority = next((name for name in names if scores[f"majority/iou/{name}"] > 0), "the majority class")

    def pair(prefix: str, iou: str, dice: str) -> str:
        return f"{scores[prefix + iou]:.3f} / {scores[prefix + dice]:.3f}"

    def both(iou: str, dice: str) -> str:
        return f"{pair('', iou, dice)} ({pair('majority/', iou, dice)})"

    classes = ", ".join(f"{name} {both(f'iou/{name}', f'dice/{name}')}" for name in names)
    return (
        f"IoU / Dice (in brackets: {majority} everywhere): {classes}; mean {both('miou', 'mdice')}; "
        f"pixel accuracy {scores['pixel_acc']:.3f} ({scores['majority/pixel_acc']:.3f})"
    )
