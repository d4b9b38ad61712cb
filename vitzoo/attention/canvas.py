"""Variable-size batches on a canvas: image b's h_b x w_b grid tokens sit at the top-left of a common H x W grid.

The canvas keeps each image's 2-D neighbourhoods (a conv over the canvas, its padded tokens seen as 0, is the conv
over the image alone with zero padding) and its integer grid positions; per-image tables (RoPE positions, learned
position tables resampled to each image's grid) are placed on it with ``on_canvas``.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from .rope import Rope, with_prefix

__all__ = ["on_canvas", "tables_on_canvas", "canvas_valid", "canvas_rope"]

Grid = Tuple[int, int]


def on_canvas(tables: Sequence[torch.Tensor], grids: Sequence[Grid], canvas: Grid) -> torch.Tensor:
    """Per-image tables (h_b * w_b, ...) in raster order, each at the top-left of an H x W canvas: (B, H * W, ...),
    0 at the padded places."""
    H, W = canvas
    out = tables[0].new_zeros(len(tables), H, W, *tables[0].shape[1:])
    for b, (table, (h, w)) in enumerate(zip(tables, grids)):
        out[b, :h, :w] = table.reshape(h, w, *table.shape[1:])
    return out.flatten(1, 2)


def tables_on_canvas(
    tables: Sequence[torch.Tensor], grids: Sequence[Grid], canvas: Grid, prefix: int, dim: int
) -> torch.Tensor:
    """Per-image tables whose axis ``dim`` runs over ``prefix`` + h_b * w_b tokens as one table with a leading batch
    axis, that axis over the canvas's prefix + H * W tokens (prefix rows as they are, grid rows ``on_canvas``)."""
    moved = [t.movedim(dim, 0) for t in tables]
    grid = on_canvas([t[prefix:] for t in moved], grids, canvas)
    return torch.cat([torch.stack([t[:prefix] for t in moved]), grid], dim=1).movedim(1, dim + 1)


def canvas_valid(grids: Sequence[Grid], canvas: Grid, prefix: int, device=None) -> torch.Tensor:
    """(B, prefix + H * W) bool: True for the prefix tokens and each image's own grid tokens."""
    H, W = canvas
    rows, cols = torch.arange(H, device=device), torch.arange(W, device=device)
    sizes = torch.tensor(list(grids), device=device).reshape(-1, 2)
    inside = (rows[None, :, None] < sizes[:, 0, None, None]) & (cols[None, None, :] < sizes[:, 1, None, None])
    return torch.cat([inside.new_ones(len(grids), prefix), inside.flatten(1)], dim=1)


def canvas_rope(rope: Rope, grids: Sequence[Grid], canvas: Grid, prefix: int, like: torch.Tensor) -> torch.Tensor:
    """The RoPE table of each image's own grid on the canvas: (B, H or 1, prefix + H * W, d/2), padded places 0."""
    positions = on_canvas([rope.positions(g, like) for g in grids], grids, canvas)
    return with_prefix(rope.angles_from(positions), prefix)
