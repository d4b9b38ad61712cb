"""Non-negative feature maps for kernel (linear) attention: sim(q, k) = phi(q) . phi(k).

Each map takes (..., D) and returns (..., D') with D' = D, except ``taylor`` which prepends a
constant 1 so that phi(q) . phi(k) = 1 + cos(q, k) (ATTENTION.md section 3).
"""
from __future__ import annotations

from typing import Callable, Dict

import torch
import torch.nn.functional as F

__all__ = ["FEATURE_MAPS", "feature_map", "feature_dim"]


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """Katharopoulos et al.: elu(x) + 1 > 0."""
    return F.elu(x) + 1.0


def relu(x: torch.Tensor) -> torch.Tensor:
    """EfficientViT-style relu features (the denominator needs its eps)."""
    return F.relu(x)


def taylor(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """[1, x / |x|]: the first-order Taylor expansion of exp(cos), non-negative in dot products."""
    unit = F.normalize(x, dim=-1, eps=eps)
    return torch.cat([torch.ones_like(unit[..., :1]), unit], dim=-1)


FEATURE_MAPS: Dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elu": elu_plus_one,
    "relu": relu,
    "taylor": taylor,
}


def feature_map(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The feature map called ``name``; a ValueError lists the valid names."""
    try:
        return FEATURE_MAPS[name]
    except KeyError:
        raise ValueError(
            f"unknown feature_map {name!r}; choose one of {sorted(FEATURE_MAPS)}"
        ) from None


def feature_dim(name: str, head_dim: int) -> int:
    """Width of phi(x) for a head of ``head_dim`` channels."""
    feature_map(name)
    return head_dim + 1 if name == "taylor" else head_dim
