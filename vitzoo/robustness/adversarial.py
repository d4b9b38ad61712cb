"""Adversarial accuracy under L-inf attacks through torchattacks (MIT), eps in pixels of a [0, 1] image.

The model's normalisation sits inside the attacked function (``Normalised``), so the attack perturbs the
[0, 1] image and eps = 8/255 means 8 grey levels. PGD: ``PGD_STEPS`` steps of 2.5 eps / steps from a random
start in the eps-ball (Madry et al. 2018's step rule, as RobustBench's PGD evaluations); FGSM (one step of
eps) is measured beside it as a check: PGD that does no better than FGSM is a broken attack.
"""
from __future__ import annotations

from typing import Dict, Iterable, Sequence

import torch
import torch.nn as nn

__all__ = ["Normalised", "adversarial_accuracy", "PGD_STEPS"]

PGD_STEPS = 10


class Normalised(nn.Module):
    """``model((x - mean) / std)`` for x in [0, 1]: what an attack in pixel space differentiates."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.mean) / self.std)


def adversarial_accuracy(model: nn.Module, batches: Iterable, mean: Sequence[float], std: Sequence[float],
                         eps: float, device: torch.device, seed: int = 0) -> Dict[str, float]:
    """Top-1 accuracy under PGD L-inf (``acc1``) and FGSM (``fgsm_acc1``) at ``eps`` (a [0, 1] pixel distance)
    on (images in [0, 1], labels) ``batches``; ``num_images``."""
    try:
        import torchattacks
    except ImportError as err:
        raise ImportError("robustness.adversarial needs torchattacks: pip install --no-deps torchattacks==3.5.1 "
                          "(its own requirements pin an old requests)") from err
    if not eps > 0:
        raise ValueError(f"adversarial eps must be > 0 (clean accuracy is the clean pass), got {eps}")
    attacked = Normalised(model, mean, std).to(device).eval()
    pgd = torchattacks.PGD(attacked, eps=eps, alpha=2.5 * eps / PGD_STEPS, steps=PGD_STEPS, random_start=True)
    fgsm = torchattacks.FGSM(attacked, eps=eps)
    torch.manual_seed(seed)  # PGD's random start
    correct = {"acc1": 0, "fgsm_acc1": 0}
    total = 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        for key, attack in (("acc1", pgd), ("fgsm_acc1", fgsm)):
            adv = attack(images, labels)
            with torch.no_grad():
                correct[key] += (attacked(adv).argmax(1) == labels).sum().item()
        total += len(labels)
    return {**{k: v / total for k, v in correct.items()}, "num_images": total}
