"""RAVLT's softmax stages (Fan et al., CVPR 2025; qhfan/RALA ``VanillaSelfAttention``): softmax attention of q and k
turned by RALA's per-head RoPE, plus LePE (a depthwise conv of V, 5x5) and RALA's linear output gate:
y = proj((softmax(tau (R q)(R k)^T) V + LePE(V)) * (x W_o + b_o)). The mathematics: docs/mechanisms.md section 23.
"""

from __future__ import annotations

from . import functional as AF
from .decoupled import rala_angles
from .gated import LinearGatedAttention
from .grid_conv import grid_conv
from .registry import register_attention
from .rope import rotate_all
from .softmax import SoftmaxAttention

__all__ = ["RavltSoftmaxAttention"]


@register_attention("ravlt_softmax")
class RavltSoftmaxAttention(LinearGatedAttention, SoftmaxAttention):
    """softmax's options (scale, fused...) with RALA's RoPE, LePE and gate. R is RALA's table (pairs of channels
    [0, d/2) by row, [d/2, d) by column, exponents linspace(0, 1, d/4)) of each input's grid, prefix tokens unturned;
    a ``rope`` option replaces it. LePE is a ``kernel_size`` depthwise conv of V (0: none)."""

    no_causal = "its LePE conv sees both sides; use attention='softmax' with is_causal"
    no_sr = "its RoPE and LePE sit on the query grid; use attention='softmax' for reduced keys"

    def __init__(self, dim: int, num_heads: int = 8, *args, kernel_size: int = 5, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        if self.head_dim % 4 and self.rope is None:
            raise ValueError(
                f"ravlt_softmax's RoPE turns channel pairs of each head, half by row and half by column: "
                f"head_dim={self.head_dim} must be a multiple of 4 (set num_heads or head_dim)"
            )
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.lepe = grid_conv(type(self).__name__, self.attn_dim, kernel_size, **dd)

    def own_rope(self, q, k):
        """q and k turned by RALA's table, unless a ``rope`` option turned them already."""
        if self.rope is not None:
            return q, k
        return rotate_all(rala_angles(self.current_grid(q.shape[-2]), self.num_prefix_tokens, self.head_dim, q), q, k)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        q, k = self.own_rope(q, k)
        out = super().mix(x, q, k, v, attn_mask, is_causal, logit_noise)
        if self.lepe is None:
            return out
        grid = self.current_grid(v.shape[-2])
        return out + self.lepe.over_grid(v, grid, self.num_prefix_tokens, AF.key_padding(attn_mask))

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        return super().probs(x, *self.own_rope(q, k), attn_mask, is_causal, query_index)
