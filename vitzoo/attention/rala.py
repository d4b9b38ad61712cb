"""Rank-augmented linear attention (RALA; Fan et al., CVPR 2025, RAVLT): keys reweighted by how well they match the
mean query, decoupled per-head RoPE, LePE (a 5x5 depthwise conv of V) and a linear output gate. The mathematics:
docs/mechanisms.md section 17.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import functional as AF
from .decoupled import DecoupledRopeAttention, positive_features, rala_angles
from .gated import LinearGatedAttention
from .registry import register_attention

__all__ = ["RalaAttention", "query_aware_keys"]


def query_aware_keys(
    fq: torch.Tensor, fk: torch.Tensor, noise=None, key_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """k'_j = n alpha_j phi(k_j), alpha = softmax_j(tau qbar . phi(k_j)), qbar the mean of phi(q) over all tokens;
    ``noise`` (B, H, n, 1) is added to those logits. Under ``key_mask`` the mean, the softmax and n run over its
    tokens."""
    n = AF.key_count(key_mask, fk)
    qbar = AF.mask_keys(fq, key_mask).sum(dim=-2, keepdim=True) / n
    logits = (qbar * fq.shape[-1] ** -0.5) @ fk.transpose(-2, -1)
    if noise is not None:
        logits = logits + noise.transpose(-2, -1)
    alpha = logits.softmax(dim=-1) if key_mask is None else AF.masked_softmax(logits, key_mask.unsqueeze(-2))
    return fk * (alpha.transpose(-2, -1) * n)


@register_attention("rala")
class RalaAttention(LinearGatedAttention, DecoupledRopeAttention):
    """y = proj((O + LePE(V)) * g), O_i = (R_i phi(q_i))^T sum_j (R_j k'_j) v_j^T / (phi(q_i) . sum_j k'_j + n eps).

    phi = elu + 1, k' the query-aware keys; R is RALA's per-head RoPE (pairs of channels [0, d/2) by row, [d/2, d)
    by column, exponents linspace(0, 1, d/4)), recomputed for each input's grid with integer positions; prefix tokens
    are not rotated and count in the mean query; a ``rope`` option replaces this table by its own. LePE is a
    ``kernel_size`` depthwise conv of V (RALA: 5); g a linear gate (no activation). Logit noise is Gaussian noise on
    the key-weighting softmax's logits.
    """

    no_causal = (
        "its key weights need the mean of all queries first (no causal form); use attention='linear' with causal: true"
    )

    def __init__(self, dim: int, num_heads: int = 8, *args, kernel_size: int = 5, **kwargs):
        super().__init__(dim, num_heads, *args, kernel_size=kernel_size, **kwargs)
        if self.head_dim % 4:
            raise ValueError(
                f"rala's RoPE turns channel pairs of each head, half by row and half by column: "
                f"head_dim={self.head_dim} must be a multiple of 4 (set num_heads or head_dim)"
            )

    def features(self, q, k, logit_noise: float = 0.0, key_mask=None):
        fq, fk = positive_features(q, k)
        fk = query_aware_keys(fq, fk, AF.key_noise(k, logit_noise), key_mask)
        return fq, fk, self.angles(fq)

    def own_angles(self, grid, like):
        return rala_angles(grid, self.num_prefix_tokens, self.head_dim, like)
