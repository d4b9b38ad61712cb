"""MLLA's linear attention (Han et al., NeurIPS 2024, "Demystify Mamba in Vision"): elu+1 features, decoupled RoPE
across all channels before the head split, and LePE (a 3x3 depthwise conv of V). Its Mamba-like block is the ViT's
``block="mlla"`` (vitzoo.models.blocks). The mathematics: docs/mechanisms.md section 16.
"""

from __future__ import annotations

from . import functional as AF
from .decoupled import DecoupledRopeAttention, mlla_angles, positive_features
from .registry import register_attention

__all__ = ["MllaAttention"]


@register_attention("mlla")
class MllaAttention(DecoupledRopeAttention):
    """o_i = (R_i phi(q_i))^T sum_j (R_j phi(k_j)) v_j^T / (phi(q_i) . sum_j phi(k_j) + n eps) + LePE(v)_i.

    phi = elu + 1. R is MLLA's RoPE over all H*d channels of the grid position (pairs of adjacent channels; the
    first half of the pairs turn with the row, the second with the column, so each head turns along one axis),
    recomputed for each input's grid with integer positions; prefix tokens are not rotated. A ``rope`` option
    replaces this table by its own (per head, docs/mechanisms.md section 20). LePE is a
    ``kernel_size`` depthwise conv of V. Logit noise is the per-key factor exp(eps_j) on phi(k_j) in numerator and
    normaliser.
    """

    no_causal = "its LePE conv sees both sides; use attention='linear' with causal: true"

    def __init__(self, dim: int, num_heads: int = 8, *args, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        if self.head_dim % 2 or self.attn_dim % 4:
            raise ValueError(
                f"mlla's RoPE turns channel pairs, half by row and half by column: "
                f"head_dim={self.head_dim} must be even and num_heads * head_dim={self.attn_dim} a "
                "multiple of 4 (set head_dim)"
            )

    def features(self, q, k, logit_noise: float = 0.0, key_mask=None):
        fq, fk = positive_features(q, k)  # per token: nothing here reads the other tokens
        noise = AF.key_noise(k, logit_noise)
        if noise is not None:
            fk = fk * noise.exp()
        return fq, fk, self.angles(fq)

    def own_angles(self, grid, like):
        return mlla_angles(grid, self.num_prefix_tokens, self.num_heads, self.head_dim, like)
