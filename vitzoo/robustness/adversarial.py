"""Adversarial accuracy under L-inf attacks, eps in pixels of a [0, 1] image.

The model's normalisation sits inside the attacked function (``Normalised``), so the attack perturbs the
[0, 1] image and eps = 8/255 means 8 grey levels. PGD (:func:`pgd`): ``PGD_STEPS`` steps of 2.5 eps / steps from a
random start in the eps-ball (Madry et al. 2018's step rule, as RobustBench's PGD evaluations); FGSM (:func:`fgsm`,
one step of eps) is measured beside it as a check: PGD that does no better than FGSM is a broken attack. Both are
written here (the tests compare them with torchattacks'). ``attack="autoattack"`` adds AutoAttack's standard set
through torchattacks (Croce & Hein 2020: APGD-CE, APGD-T, FAB-T, Square with 5,000 queries, each on the images the
ones before left correct), RobustBench's L-inf number and far more expensive than PGD.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from vitzoo.errors import MissingDependency

__all__ = [
    "Normalised",
    "adversarial_accuracy",
    "pgd",
    "fgsm",
    "require_torchattacks",
    "PGD_STEPS",
    "ATTACKS",
    "ATTACK_SETS",
    "TORCHATTACKS_INSTALL",
]

PGD_STEPS = 10
ATTACKS = ("pgd", "autoattack")
ATTACK_SETS = {
    "pgd": "PGD-10 + FGSM",  # what each attack runs, as the records name it
    "autoattack": "AutoAttack standard (APGD-CE, APGD-T, FAB-T, Square) + PGD-10 + FGSM",
}
TORCHATTACKS_INSTALL = "pip install --no-deps torchattacks==3.5.1"  # its own requirements pin an old requests


class Normalised(nn.Module):
    """``model((x - mean) / std)`` for x in [0, 1]: what an attack in pixel space differentiates."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model((x - self.mean) / self.std)


def _input_gradient_sign(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    images = images.detach().requires_grad_(True)
    loss = F.cross_entropy(model(images), labels)
    return torch.autograd.grad(loss, images)[0].sign()


def fgsm(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, eps: float) -> torch.Tensor:
    """Fast gradient sign method: ``clamp(x + eps sign(grad_x CE), 0, 1)``."""
    return (images + eps * _input_gradient_sign(model, images, labels)).clamp(0, 1).detach()


def pgd(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: float,
    alpha: float,
    steps: int,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Projected gradient descent on the cross-entropy in the L-inf ball of radius ``eps`` around ``images``
    (in [0, 1]): a uniform random start in the ball, then ``steps`` sign-gradient steps of ``alpha``, each
    projected back into the ball and onto [0, 1]. ``generator`` draws the start."""
    start = torch.empty_like(images).uniform_(-eps, eps, generator=generator)
    adv = (images + start).clamp(0, 1)
    for _ in range(steps):
        adv = adv + alpha * _input_gradient_sign(model, adv, labels)
        adv = (images + (adv - images).clamp(-eps, eps)).clamp(0, 1)
    return adv.detach()


def require_torchattacks():
    """The torchattacks module (AutoAttack), or one error naming its install."""
    try:
        import torchattacks
    except ImportError as err:
        raise MissingDependency(
            f"attack='autoattack' needs torchattacks: {TORCHATTACKS_INSTALL} (its own requirements "
            f"pin an old requests); attack='pgd' needs nothing more"
        ) from err
    return torchattacks


def adversarial_accuracy(
    model: nn.Module,
    batches: Iterable,
    mean: Sequence[float],
    std: Sequence[float],
    eps: float,
    device: torch.device,
    seed: int = 0,
    attack: str = "pgd",
) -> Dict[str, float]:
    """Top-1 accuracy under PGD L-inf (``acc1``) and FGSM (``fgsm_acc1``) at ``eps`` (a [0, 1] pixel distance)
    on (images in [0, 1], labels) ``batches``; with ``attack="autoattack"`` also under AutoAttack's standard set
    (``autoattack_acc1``); ``num_images``. ``seed`` seeds PGD's random starts (and AutoAttack)."""
    if not eps > 0:
        raise ValueError(f"adversarial eps must be > 0 (clean accuracy is the clean pass), got {eps}")
    if attack not in ATTACKS:
        raise ValueError(
            f"attack={attack!r}; choose pgd (PGD-10 and FGSM) or autoattack (adds AutoAttack's standard "
            f"set, far slower)"
        )
    torchattacks = require_torchattacks() if attack == "autoattack" else None
    attacked = Normalised(model, mean, std).to(device).eval()
    generator = torch.Generator(device).manual_seed(seed)
    attacks = {
        "acc1": lambda x, y: pgd(attacked, x, y, eps, 2.5 * eps / PGD_STEPS, PGD_STEPS, generator),
        "fgsm_acc1": lambda x, y: fgsm(attacked, x, y, eps),
    }
    correct = dict.fromkeys([*attacks, *(["autoattack_acc1"] if torchattacks else [])], 0)
    total = 0
    for images, labels in batches:
        images, labels = images.to(device), labels.to(device)
        if torchattacks and "autoattack_acc1" not in attacks:  # its class count from the logits
            with torch.no_grad():
                classes = attacked(images[:1]).shape[1]
            attacks["autoattack_acc1"] = torchattacks.AutoAttack(
                attacked, norm="Linf", eps=eps, version="standard", n_classes=classes, seed=seed
            )
        for key, method in attacks.items():
            adv = method(images, labels)
            with torch.no_grad():
                correct[key] += (attacked(adv).argmax(1) == labels).sum().item()
        total += len(labels)
    return {**{k: v / total for k, v in correct.items()}, "num_images": total}
