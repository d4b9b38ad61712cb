"""The fused feature maps, by name: the one table of each map's value and derivative.

``FUSED_MAPS[name]`` holds ``value(x)`` (plain torch: the naive reference and the eager path), the
chunked torch path's ``phi(x, buf) -> (f, aux)`` into scratch and ``grad(df, f, aux, out) -> dx``
(may overwrite ``df`` and ``f``; ``aux`` is what the derivative needs, e.g. elu's exp part), how
many features the map adds to the head dim, and its number in the compiled kernels (the C++ CPU
kernel's ``Map`` enum and the Triton kernels' ``FEATURE``; None: they do not apply it themselves):
``KERNEL_MAPS`` is that column, and a test reads both kernels' sources against it.
``identity`` takes features computed beforehand, so any feature map (with parameters, random
features) runs on the fused O(n) path through it.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F

__all__ = [
    "FUSED_MAPS",
    "KERNEL_MAPS",
    "FusedMap",
    "feature_map",
    "mask_keys",
    "elu_plus_one",
    "relu",
    "taylor",
    "identity",
]

TAYLOR_NORM_EPS = 1e-6
_LOG2E = math.log2(math.e)


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """Katharopoulos et al.: elu(x) + 1 > 0."""
    return F.elu(x) + 1.0


def relu(x: torch.Tensor) -> torch.Tensor:
    """EfficientViT-style relu features (the denominator needs its eps)."""
    return F.relu(x)


def taylor(x: torch.Tensor, eps: float = TAYLOR_NORM_EPS) -> torch.Tensor:
    """[1, x / |x|]: the first-order Taylor expansion of exp(cos), non-negative in dot products."""
    unit = F.normalize(x, dim=-1, eps=eps)
    return torch.cat([torch.ones_like(unit[..., :1]), unit], dim=-1)


def identity(x: torch.Tensor) -> torch.Tensor:
    """Features computed beforehand (by a feature-map module), taken as they are."""
    return x


def _elu_phi(x, buf):
    # elu(x) + 1 = exp(min(x, 0)) + max(x, 0) in cheap passes (elu's own kernel is slower, and
    # exp2 is about twice as fast as exp here); the exp part is also the derivative.
    e = torch.mul(x, _LOG2E, out=buf("e", x.shape)).clamp_(max=0).exp2_()
    return torch.clamp(x, min=0, out=buf("f", x.shape)).add_(e), e


def _elu_grad(df, f, e, out):
    return torch.mul(df, e, out=out)


def _relu_phi(x, buf):
    f = torch.clamp(x, min=0, out=buf("f", x.shape))
    return f, f


def _relu_grad(df, f, aux, out):
    return torch.mul(df, f.sign_(), out=out)  # relu features are >= 0: sign(f) is the 0/1 mask


def _taylor_phi(x, buf):
    return taylor(x), x


def _taylor_grad(df, f, x, out):
    """VJP of [1, x / max(|x|, eps)]: the tangential part of dU over |x| (dU / eps below eps)."""
    unit, dunit = f[..., 1:], df[..., 1:]
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    radial = torch.linalg.vecdot(unit, dunit).unsqueeze(-1) * (norm > TAYLOR_NORM_EPS)
    return torch.div(dunit - unit * radial, norm.clamp_min(TAYLOR_NORM_EPS), out=out)


def _identity_phi(x, buf):
    return buf("f", x.shape).copy_(x), None


def _identity_grad(df, f, aux, out):
    return out.copy_(df)


class FusedMap(NamedTuple):
    """A fused feature map: its value, the torch path's in-scratch value and derivative, added width, its number in
    the compiled kernels (None where they do not apply it), and an input whose feature and derivative are 0 (a
    padded key is set to it; None: no such input, the features are computed first)."""

    value: Callable[[torch.Tensor], torch.Tensor]
    phi: Callable
    grad: Callable
    extra: int = 0
    kernel: Optional[int] = None
    zero_input: Optional[float] = None


FUSED_MAPS: Dict[str, FusedMap] = {
    "elu": FusedMap(elu_plus_one, _elu_phi, _elu_grad, kernel=0, zero_input=float("-inf")),  # exp(-inf) = 0
    "relu": FusedMap(relu, _relu_phi, _relu_grad, kernel=1, zero_input=0.0),
    "taylor": FusedMap(taylor, _taylor_phi, _taylor_grad, extra=1),  # [1, x / |x|] is never 0
    "identity": FusedMap(identity, _identity_phi, _identity_grad, kernel=2, zero_input=0.0),
}
KERNEL_MAPS: Dict[str, int] = {name: m.kernel for name, m in FUSED_MAPS.items() if m.kernel is not None}


def feature_map(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The value function of the fused map ``name``; a ValueError lists the valid names."""
    try:
        return FUSED_MAPS[name].value
    except (KeyError, TypeError):
        raise ValueError(f"unknown feature_map {name!r}; choose one of {sorted(FUSED_MAPS)}") from None


def mask_keys(fk: torch.Tensor, key_mask: Optional[torch.Tensor], fill: float = 0.0) -> torch.Tensor:
    """phi(k_j) -> ``fill`` (0) for every key j whose ``key_mask`` (bool, broadcasting to (B, H, Nk)) is False, so
    padded keys add nothing to the sums over keys (a select, not a product: a non-finite padded feature stays out)."""
    if key_mask is None:
        return fk
    return torch.where(key_mask.unsqueeze(-1), fk, fk.new_full((), fill))
