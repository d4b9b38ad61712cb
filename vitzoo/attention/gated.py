"""A linear output gate: the merged head outputs times g = x W_g + b_g (no activation) before the output projection,
as PolaFormer and RALA wire it. It composes with the sigmoid gate of every mechanism (``gate``), which then
multiplies after it: proj(norm(out * g) * sigmoid(x W_s + b_s))."""

from __future__ import annotations

import torch
import torch.nn as nn

from .base import ZooAttention

__all__ = ["LinearGatedAttention"]


class LinearGatedAttention(ZooAttention):
    """``proj((mixed heads) * gate(x))``: ``gate`` is a Linear C -> H*d with a bias when ``qkv_bias``."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, *args, **kwargs):
        super().__init__(dim, num_heads, qkv_bias, *args, **kwargs)
        self.gate = nn.Linear(dim, self.attn_dim, bias=qkv_bias, device=kwargs.get("device"), dtype=kwargs.get("dtype"))

    def output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return super().output(x, out * self.gate(x))
