"""The naive reference of linear attention (fla's ``ops/<op>/naive.py`` habit): the one eager formula.

out_i = phi(q_i) S_i / (phi(q_i).z_i + eps), S_i = sum_j phi(k_j)^T v_j, z_i = sum_j phi(k_j), the sums
over every key (non-causal) or keys j <= i (causal), a key whose ``key_mask`` is False left out. Plain torch
ops: the eager path, the create_graph backward of the fused paths, and what exporters record where they cannot
carry the fused op.
"""

from __future__ import annotations

from typing import Optional

import torch

from .dtypes import sum_dtype
from .feature_maps import feature_map as _value
from .feature_maps import mask_keys

__all__ = ["naive_linear_attention"]


def naive_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: str = "identity",
    eps: float = 1e-6,
    causal: bool = False,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """(B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, Dv) -> (B, H, Nq, Dv) in v's dtype, sums in fp32 or wider.

    ``feature_map`` names a fused map (``identity``: q and k are features already); ``key_mask`` (bool, broadcasting
    to (B, H, Nk); True = the key counts) zeroes the features of the other keys."""
    phi = _value(feature_map)
    wide = sum_dtype(q.dtype)
    fq, fk, vf = phi(q.to(wide)), mask_keys(phi(k.to(wide)), key_mask), v.to(wide)
    if causal:
        # S_i = sum_{j<=i} phi(k_j)^T v_j as a cumulative sum of outer products (n*d^2 memory).
        state = torch.cumsum(fk.unsqueeze(-1) * vf.unsqueeze(-2), dim=-3)
        num = (fq.unsqueeze(-2) @ state).squeeze(-2)
        den = (fq * fk.cumsum(dim=-2)).sum(dim=-1, keepdim=True)
    else:
        num = fq @ (fk.transpose(-2, -1) @ vf)
        den = fq @ fk.sum(dim=-2).unsqueeze(-1)
    return (num / (den + eps)).to(v.dtype)
