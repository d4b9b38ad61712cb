"""One classifier through a robustness sweep: clean, input corruptions, attention-logit noise, resolutions.

Every pass is seeded and drawn in the same order, so two checkpoints evaluated with the same
``Sweep`` see the very same corrupted images, and a pass repeats exactly. Images come from the
loader in [0, 1] (corruptions are defined there) and are normalised with the model's mean/std
just before the forward pass. Clean and resolution passes also report the attention entropy
(mean over layers of H / log n) on the first ``ENTROPY_IMAGES`` images, which is what the log-n
scale is meant to hold steady across resolutions.
"""

from __future__ import annotations

import math
import numbers
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn as nn

from vitzoo.attention import ZooAttention
from vitzoo.diagnostics import attention_entropy
from vitzoo.options import SweepOptions
from vitzoo.training.evaluate import evaluate

from .adversarial import ATTACKS, adversarial_accuracy
from .attention_noise import attention_noise
from .corruptions import PROTOCOLS, corrupt, list_corruptions

__all__ = [
    "Sweep",
    "Pass",
    "sweep_passes",
    "run_pass",
    "resolution_size",
    "patch_multiple",
    "CLEAN",
    "LOGIT_NOISE",
    "RESOLUTION",
    "ADVERSARIAL",
]

CLEAN, LOGIT_NOISE, RESOLUTION, ADVERSARIAL = "clean", "logit_noise", "resolution", "pgd_linf"
ENTROPY_IMAGES = 32


@dataclass
class Sweep(SweepOptions):
    """What to measure (:class:`~vitzoo.options.SweepOptions`' fields, their defaults and meaning), checked: known
    corruptions and protocol, severities 1..5, sigmas >= 0, positive radii and resolution factors, a known attack.
    ``resolutions`` are factors of the training size (1.5 = 48 px for 32 px training), rounded to a multiple of
    the model's patch; ``adversarial`` radii are grey levels (8 = 8/255 of a [0, 1] image)."""

    def __post_init__(self):
        for name in ("corruptions", "severities", "logit_noise", "resolutions", "adversarial"):
            value = getattr(self, name)
            if isinstance(value, (str, numbers.Number)):
                raise ValueError(f"robustness.{name} must be a list, got {value!r}; write e.g. {name}=[{value}]")
            setattr(self, name, tuple(value))
        valid = list_corruptions()
        unknown = [c for c in self.corruptions if c not in valid]
        if unknown:
            raise ValueError(f"unknown corruption(s) {unknown}; choose from {valid}")
        bad = [s for s in self.severities if not isinstance(s, numbers.Integral) or not 1 <= s <= 5]
        if bad:
            raise ValueError(
                f"robustness.severities {bad} out of range; severities are 1..5 (clean is always measured)"
            )
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown protocol {self.protocol!r}; choose one of {list(PROTOCOLS)} or null (by image size)"
            )
        if any(s < 0 for s in self.logit_noise):
            raise ValueError(f"robustness.logit_noise {list(self.logit_noise)} holds a negative sigma; use values >= 0")
        if any(e <= 0 for e in self.adversarial):
            raise ValueError(
                f"robustness.adversarial {list(self.adversarial)} must be positive L-inf radii in grey "
                f"levels of 255, e.g. [1, 2, 4, 8]"
            )
        if self.attack not in ATTACKS:
            raise ValueError(
                f"robustness.attack={self.attack!r}; choose pgd (PGD-10 and FGSM) or autoattack (adds "
                f"AutoAttack's standard set, far slower)"
            )
        if self.attack != "pgd" and not self.adversarial:
            raise ValueError(
                f"robustness.attack={self.attack} attacks at the radii of robustness.adversarial, which "
                f"is empty; add e.g. robustness.adversarial=[8]"
            )
        if any(r <= 0 for r in self.resolutions):
            raise ValueError(
                f"robustness.resolutions {list(self.resolutions)} must be positive factors of the "
                f"training size, e.g. [1.5, 2.0]"
            )


@dataclass(frozen=True)
class Pass:
    """One evaluation pass: ``test`` (clean, a corruption name, logit_noise, resolution) at ``level``."""

    test: str
    level: float

    def __str__(self) -> str:
        return self.test if self.test == CLEAN else f"{self.test} {self.level:g}"


def sweep_passes(sweep: Sweep) -> List[Pass]:
    """Every pass of ``sweep``, clean first."""
    passes = [Pass(CLEAN, 0)]
    passes += [Pass(c, s) for c in sweep.corruptions for s in sweep.severities]
    passes += [Pass(LOGIT_NOISE, float(s)) for s in sweep.logit_noise]
    passes += [Pass(RESOLUTION, float(r)) for r in sweep.resolutions]
    passes += [Pass(ADVERSARIAL, float(e)) for e in sweep.adversarial]
    return passes


def resolution_size(img_size: int, factor: float, multiple: int) -> int:
    """``factor * img_size`` rounded (halves up) to a multiple of ``multiple`` (the patch size), at least one."""
    return max(multiple, math.floor(factor * img_size / multiple + 0.5) * multiple)


def patch_multiple(model: nn.Module) -> int:
    """The size inputs must be a multiple of: a ViT's patch size, else 1."""
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", 1)
    return int(patch[0] if isinstance(patch, (tuple, list)) else patch)


def _normaliser(mean: Sequence[float], std: Sequence[float], device) -> Callable[[torch.Tensor], torch.Tensor]:
    m = torch.tensor(mean, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, device=device).view(1, -1, 1, 1)
    return lambda x: (x - m) / s


def run_pass(
    model: nn.Module,
    step: Pass,
    sweep: Sweep,
    img_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    loader_at: Callable[[int], Iterable],
    device: torch.device,
    released: Optional[Callable[[str, int], Iterable]] = None,
) -> Dict[str, float]:
    """Evaluate ``model`` (in eval mode) for one pass; returns the ``evaluate`` metrics plus the ``level``.

    ``loader_at(size)`` yields (images in [0, 1] at ``size`` x ``size``, labels). A resolution pass
    reports the image size in pixels as its level. With ``released(corruption, severity)`` (the released
    files' images in [0, 1], labels), a corruption pass reads those, only normalised, instead of
    corrupting the val split.
    """
    if step.test == ADVERSARIAL:  # PGD at eps = level / 255 on the val split, FGSM (and AutoAttack) beside it
        return {
            **adversarial_accuracy(
                model, loader_at(img_size), mean, std, step.level / 255, device, sweep.seed, sweep.attack
            ),
            "level": step.level,
        }
    normalise = _normaliser(mean, std, device)
    size, preprocess, noise, source = img_size, normalise, 0.0, None
    level = step.level
    if step.test == RESOLUTION:
        size = level = resolution_size(img_size, step.level, patch_multiple(model))
    elif step.test == LOGIT_NOISE:
        noise = step.level
    elif step.test != CLEAN and released is not None:
        source = released(step.test, int(step.level))
    elif step.test != CLEAN:
        generator = torch.Generator().manual_seed(sweep.seed)  # CPU: the same draws on any device

        def preprocess(x: torch.Tensor) -> torch.Tensor:
            return normalise(corrupt(x, step.test, int(step.level), sweep.protocol, generator=generator))

    # A DataLoader draws its base seed from the global RNG at iter(): seed after it, so the logit noise draws
    # are the same for any loader.
    batches = iter(source if source is not None else loader_at(size))
    torch.manual_seed(sweep.seed)
    with attention_noise(model, noise) if step.test == LOGIT_NOISE else nullcontext():
        metrics = evaluate(model, batches, device, preprocess)
    if step.test in (CLEAN, RESOLUTION) and any(isinstance(m, ZooAttention) for m in model.modules()):
        images = next(iter(loader_at(size)))[0][:ENTROPY_IMAGES].to(device)
        layers = attention_entropy(model, preprocess(images))
        metrics["entropy"] = sum(layers.values()) / len(layers)
    return {**metrics, "level": level}
