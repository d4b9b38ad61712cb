"""The noise family: ``fn(images, c, generator)`` with the reference formulas (``c`` the severity's constant)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .draws import draw_device, normal, uniform


def gaussian_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    """``x + N(0, c^2)``."""
    return x + normal(x.shape, x, generator, std=c)


def shot_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    """``Poisson(x c) / c``."""
    rate = (x * c).to(draw_device(x, generator))
    return torch.poisson(rate, generator=generator).to(x.device) / c


def impulse_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    """Salt and pepper per element as scikit-image's ``random_noise(mode="s&p", amount=c)``."""
    u = uniform(x.shape, x, generator)  # u < c/2: salt, c/2 <= u < c: pepper, else untouched
    return torch.where(u < c, (u < c / 2).to(x.dtype), x)


def speckle_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    """``x + x N(0, c^2)``."""
    return x + x * normal(x.shape, x, generator, std=c)
