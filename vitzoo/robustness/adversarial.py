"""Adversarial accuracy under L-inf attacks through torchattacks (MIT), eps in pixels of a [0, 1] image.

The model's normalisation sits inside the attacked function (``Normalised``), so the attack perturbs the
[0, 1] image and eps = 8/255 means 8 grey levels. PGD: ``PGD_STEPS`` steps of 2.5 eps / steps from a random
start in the eps-ball (Madry et al. 2018's step rule, as RobustBench's PGD evaluations); FGSM (one step of
eps) is measured beside it as a check: PGD that does no better than FGSM is a broken attack. ``attack="autoattack"``
adds AutoAttack's standard set (Croce & Hein 2020: APGD-CE, APGD-T, FAB-T, Square with 5,000 queries, each on the
images the ones before left correct), RobustBench's L-inf number and far more expensive than PGD.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Dict, Iterable, Sequence

import torch
import torch.nn as nn

__all__ = ["Normalised", "adversarial_accuracy", "require_torchattacks", "PGD_STEPS", "ATTACKS", "ATTACK_SETS"]

PGD_STEPS = 10
ATTACKS = ("pgd", "autoattack")
ATTACK_SETS = {"pgd": "PGD-10 + FGSM",  # what each robustness.attack runs, as the records name it
               "autoattack": "AutoAttack standard (APGD-CE, APGD-T, FAB-T, Square) + PGD-10 + FGSM"}


class Normalised(nn.Module):
    """``model((x - mean) / std)`` for x in [0, 1]: what an attack in pixel space differentiates."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.mean) / self.std)


def require_torchattacks():
    """The torchattacks module, or one error naming its install."""
    try:
        import torchattacks
    except ImportError as err:
        raise ImportError("robustness.adversarial needs torchattacks: pip install --no-deps torchattacks==3.5.1 "
                          "(its own requirements pin an old requests)") from err
    return torchattacks


def adversarial_accuracy(model: nn.Module, batches: Iterable, mean: Sequence[float], std: Sequence[float],
                         eps: float, device: torch.device, seed: int = 0, attack: str = "pgd") -> Dict[str, float]:
    """Top-1 accuracy under PGD L-inf (``acc1``) and FGSM (``fgsm_acc1``) at ``eps`` (a [0, 1] pixel distance)
    on (images in [0, 1], labels) ``batches``; with ``attack="autoattack"`` also under AutoAttack's standard set
    (``autoattack_acc1``); ``num_images``."""
    torchattacks = require_torchattacks()
    if not eps > 0:
        raise ValueError(f"adversarial eps must be > 0 (clean accuracy is the clean pass), got {eps}")
    if attack not in ATTACKS:
        raise ValueError(f"robustness.attack={attack!r}; choose pgd (PGD-10 and FGSM) or autoattack (adds "
                         f"AutoAttack's standard set, far slower)")
    attacked = Normalised(model, mean, std).to(device).eval()
    attacks = {"acc1": torchattacks.PGD(attacked, eps=eps, alpha=2.5 * eps / PGD_STEPS, steps=PGD_STEPS,
                                        random_start=True),
               "fgsm_acc1": torchattacks.FGSM(attacked, eps=eps)}
    torch.manual_seed(seed)  # PGD's random start
    correct = dict.fromkeys([*attacks, *(["autoattack_acc1"] if attack == "autoattack" else [])], 0)
    total = 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        if "autoattack_acc1" in correct and "autoattack_acc1" not in attacks:  # its class count from the logits
            with torch.no_grad():
                classes = attacked(images[:1]).shape[1]
            attacks["autoattack_acc1"] = torchattacks.AutoAttack(attacked, norm="Linf", eps=eps, version="standard",
                                                                 n_classes=classes, seed=seed)
        for key, method in attacks.items():
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []) \
                    if key == "autoattack_acc1" else nullcontext():  # it re-seeds the global RNG: PGD's stays as is
                adv = method(images, labels)
            with torch.no_grad():
                correct[key] += (attacked(adv).argmax(1) == labels).sum().item()
        total += len(labels)
    return {**{k: v / total for k, v in correct.items()}, "num_images": total}
