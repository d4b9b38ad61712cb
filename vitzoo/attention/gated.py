"""A linear output gate: the merged head outputs times g = x W_g + b_g (no activation) before the output projection,
as PolaFormer and RALA wire it."""

from __future__ import annotations

from typing import Optional

import torch
import torch.fx
import torch.nn as nn

from .base import ZooAttention, attend

__all__ = ["LinearGatedAttention"]

torch.fx.wrap("attend")  # a leaf when torch.fx traces this module's forward too (fx.wrap patches by module)


class LinearGatedAttention(ZooAttention):
    """``proj((mixed heads) * gate(x))``: ``gate`` is a Linear C -> H*d with a bias when ``qkv_bias``."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, *args, **kwargs):
        super().__init__(dim, num_heads, qkv_bias, *args, **kwargs)
        self.gate = nn.Linear(dim, self.attn_dim, bias=qkv_bias, device=kwargs.get("device"), dtype=kwargs.get("dtype"))

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = self.project(x)
        out = attend(self, x, q, k, v, attn_mask, is_causal).transpose(1, 2).reshape(B, N, self.attn_dim)
        return self.proj_drop(self.proj(self.norm(out * self.gate(x))))
