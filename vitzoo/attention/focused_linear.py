"""Focused linear attention (FLatten, Han et al. ICCV 2023): a sharpening feature map plus a depthwise
convolution on V that restores the rank linear attention loses. The mathematics: docs/mechanisms.md
section 10.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .feature_maps import FeatureMap, register_feature_map
from .functional import acc
from .grid_conv import grid_conv
from .linear import LinearAttention
from .performer import refuse_feature_map
from .registry import register_attention

__all__ = ["focus", "FocusedFeatureMap", "FocusedLinearAttention"]

NO_CAUSAL = ("focused_linear has no causal form (its conv sees both sides); drop causal, or use attention='linear' "
             "with causal: true")


def focus(x: torch.Tensor, power: float) -> torch.Tensor:
    """f_p(x) = |x| x^p / |x^p| (element-wise power, norms over the last dim); f_p(0) = 0."""
    return x.norm(dim=-1, keepdim=True) * F.normalize(x ** power, dim=-1)


@register_feature_map("focused")
class FocusedFeatureMap(FeatureMap):
    """phi_p(x) = f_p(relu(x) / softplus(s)), ``power`` p, s a learnable scale per head channel (starts at 0)."""

    def __init__(self, head_dim: int, num_heads: int = 1, *, power: float = 3.0):
        super().__init__(head_dim, num_heads)
        if not power > 0:
            raise ValueError(f"power must be > 0 (1 = plain relu features, FLatten uses 3), got {power}")
        self.power = power
        self.scale = nn.Parameter(torch.zeros(num_heads, 1, head_dim))

    def forward(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        return focus(F.relu(acc(x)) / F.softplus(acc(self.scale)), self.power)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, power={self.power}"


@register_attention("focused_linear")
class FocusedLinearAttention(LinearAttention):
    """Linear attention with the focused map, plus DWC(V): a ``kernel_size`` depthwise conv over the patch grid
    (0: none).

    Prefix (class / register) tokens are not on the grid: the conv sees only grid tokens (zero padding at
    the border) and prefix outputs get no conv term. Logit noise is linear attention's exp(eps_j) per key.
    Focused features make phi(q).phi(k) small (row sums of 1e-3 are common), so ``eps`` defaults to 1e-8.
    """

    no_causal = "its conv sees both sides; drop causal, or use attention='linear' with causal: true"

    def __init__(self, dim: int, num_heads: int = 8, *args, power: float = 3.0, kernel_size: int = 5,
                 eps: float = 1e-8, **kwargs):
        refuse_feature_map("focused_linear", kwargs)
        super().__init__(dim, num_heads, *args, feature_map={"name": "focused", "power": power}, eps=eps, **kwargs)
        self.dwc = grid_conv("focused_linear", self.attn_dim, kernel_size, **kwargs)
        if self.causal:
            raise ValueError(NO_CAUSAL)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        out = super().mix(x, q, k, v, attn_mask, is_causal, logit_noise)
        if self.dwc is None:
            return out
        return out + self.dwc.over_grid(v, self.current_grid(v.shape[-2]), self.num_prefix_tokens)
