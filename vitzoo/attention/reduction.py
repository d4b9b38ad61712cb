"""Spatial reduction of the keys and values (PVT's SRA, docs/mechanisms.md section 24).

The key/value input is laid back on the patch grid and shrunk before its projections: by a stride-``sr_ratio`` conv
and a LayerNorm (PVT v1, PVTv2), or by an average pool to ``sr_pool`` x ``sr_pool``, a 1x1 conv, a LayerNorm and GELU
(PVTv2's linear SR). Queries keep every token, so the attention is n x n/sr^2 (or n x sr_pool^2).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..options import is_count

__all__ = ["SpatialReduction", "spatial_reduction"]


class SpatialReduction(nn.Module):
    """Tokens (B, P + h*w, C) on an (h, w) grid -> (B, P + h'*w', C): the grid part reduced, ``P`` prefix tokens kept.

    ``ratio``: conv with kernel = stride = ratio, then LN (eps 1e-5). ``pool``: adaptive average pool to pool x pool,
    1x1 conv, LN, GELU. Module names follow timm's PVTv2 attention (``sr``, ``norm``).
    """

    def __init__(self, dim: int, ratio: int = 1, pool: Optional[int] = None, device=None, dtype=None):
        super().__init__()
        self.ratio, self.pool = ratio, pool
        kernel = 1 if pool else ratio
        self.sr = nn.Conv2d(dim, dim, kernel, stride=kernel, device=device, dtype=dtype)
        self.norm = nn.LayerNorm(dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, grid: Tuple[int, int], num_prefix: int = 0) -> torch.Tensor:
        B, _, C = x.shape
        if not self.pool and min(grid) < self.ratio:
            raise ValueError(
                f"spatial reduction by sr_ratio={self.ratio} needs a grid of at least {self.ratio}x{self.ratio} "
                f"tokens, and this input gives {grid[0]}x{grid[1]}; give a larger input or a smaller sr_ratio"
            )
        g = x[:, num_prefix:].transpose(1, 2).reshape(B, C, *grid)
        if self.pool:
            g = F.adaptive_avg_pool2d(g, self.pool)
        g = self.norm(self.sr(g).flatten(2).transpose(1, 2))
        if self.pool:
            g = F.gelu(g)
        return torch.cat([x[:, :num_prefix], g], dim=1) if num_prefix else g

    def extra_repr(self) -> str:
        return f"pool={self.pool}" if self.pool else f"ratio={self.ratio}"


def spatial_reduction(
    mechanism: str, dim: int, sr_ratio: int, sr_pool: Optional[int], no_sr: Optional[str], device=None, dtype=None
) -> Optional[SpatialReduction]:
    """The reduction the options ask for (None for ``sr_ratio`` 1 and no ``sr_pool``), or a one-line refusal."""
    if not is_count(sr_ratio):
        raise ValueError(f"sr_ratio must be a positive integer (the key grid's stride), got {sr_ratio!r}")
    if sr_pool is not None and not is_count(sr_pool):
        raise ValueError(f"sr_pool must be a positive integer (the pooled key grid's side) or null, got {sr_pool!r}")
    if sr_pool is not None and int(sr_ratio) != 1:
        raise ValueError(
            f"sr_ratio={sr_ratio} and sr_pool={sr_pool}: choose one (PVTv2's linear SR pools, its SR strides)"
        )
    if int(sr_ratio) == 1 and sr_pool is None:
        return None
    if no_sr is not None:
        raise ValueError(f"{mechanism} takes no spatial reduction (sr_ratio / sr_pool): {no_sr}")
    return SpatialReduction(dim, int(sr_ratio), None if sr_pool is None else int(sr_pool), device, dtype)
