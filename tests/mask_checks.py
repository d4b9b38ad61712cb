"""Padded batches for the mask tests: images of different grids on one common canvas, padded keys masked.

Image i's grid tokens sit at the top-left h_i x w_i of an H x W canvas (H, W the largest sides), in raster order
of the canvas, after the prefix tokens; the other canvas tokens are padding, filled with large random values so
that anything leaking from them shows. The mask is timm's boolean key-padding form (B, 1, 1, N), True = attend.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

Grid = Tuple[int, int]


def canvas_grid(grids: Sequence[Grid]) -> Grid:
    return max(g[0] for g in grids), max(g[1] for g in grids)


def pad_tokens(xs: Sequence[torch.Tensor], grids: Sequence[Grid], prefix: int, seed: int = 0):
    """(x (B, prefix + H W, C), attn_mask (B, 1, 1, N) bool, (H, W)) from images xs[i] (1, prefix + h_i w_i, C)."""
    (H, W), C = canvas_grid(grids), xs[0].shape[-1]
    g = torch.Generator().manual_seed(seed)
    x = 10 * torch.randn(len(xs), prefix + H * W, C, generator=g, dtype=xs[0].dtype)
    valid = torch.zeros(len(xs), H, W, dtype=torch.bool)
    for i, ((h, w), xi) in enumerate(zip(grids, xs)):
        x[i, :prefix] = xi[0, :prefix]
        x[i, prefix:].view(H, W, C)[:h, :w] = xi[0, prefix:].reshape(h, w, C)
        valid[i, :h, :w] = True
    keys = torch.cat([torch.ones(len(xs), prefix, dtype=torch.bool), valid.flatten(1)], dim=1)
    return x, keys[:, None, None, :], (H, W)


def symmetric(mask: torch.Tensor) -> torch.Tensor:
    """The (B, 1, N, N) form of a key-padding mask as timm's NaFlex builds it: padded queries attend nothing."""
    keys = mask[:, :, 0]
    return keys.unsqueeze(-1) & keys.unsqueeze(-2)


def unpad(out: torch.Tensor, i: int, grid: Grid, canvas: Grid, prefix: int) -> torch.Tensor:
    """Image i's tokens (1, prefix + h w, C) of a padded output (B, prefix + H W, C)."""
    (h, w), (H, W) = grid, canvas
    body = out[i, prefix:].reshape(H, W, -1)[:h, :w].reshape(h * w, -1)
    return torch.cat([out[i, :prefix], body])[None]


def images(grids: Sequence[Grid], prefix: int, dim: int, seed: int = 1) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, prefix + h * w, dim, generator=g, dtype=torch.float64) for h, w in grids]
