"""Random draws for the corruptions: from ``generator`` on its own device, returned on the images' device.

Drawing where the generator lives means a CPU generator gives the same corruption to CPU and CUDA
images; ``generator=None`` draws from the global RNG of the images' device.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor


def draw_device(x: Tensor, generator: Optional[torch.Generator]) -> torch.device:
    return x.device if generator is None else generator.device


def uniform(
    shape: Sequence[int],
    x: Tensor,
    generator: Optional[torch.Generator],
    low: float = 0.0,
    high: float = 1.0,
    dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """U[low, high) of ``shape`` (``x``'s dtype unless given), on ``x``'s device."""
    u = torch.rand(tuple(shape), generator=generator, device=draw_device(x, generator), dtype=dtype or x.dtype)
    return (low + (high - low) * u).to(x.device)


def normal(
    shape: Sequence[int],
    x: Tensor,
    generator: Optional[torch.Generator],
    mean: float = 0.0,
    std: float = 1.0,
    dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """N(mean, std^2) of ``shape`` (``x``'s dtype unless given), on ``x``'s device."""
    z = torch.randn(tuple(shape), generator=generator, device=draw_device(x, generator), dtype=dtype or x.dtype)
    return (mean + std * z).to(x.device)


def integers(low: int, high: int, shape: Sequence[int], x: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """Integers in [low, high) (int64) of ``shape``, on ``x``'s device (numpy's ``randint(low, high)``)."""
    return torch.randint(low, high, tuple(shape), generator=generator, device=draw_device(x, generator)).to(x.device)
