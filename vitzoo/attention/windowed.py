"""Any mechanism inside (shifted) windows: Swin's partition around its ``mix`` (docs/mechanisms.md section 25).

The grid is cut into ``window`` x ``window`` windows (clipped to the grid per axis); on a shifted layer (every second
block) the borders move by window // 2, the partition Swin reaches with its cyclic shift and mask. Each window is
one batch entry of the mechanism (``layer`` below, a ``ZooAttention``), its ``token_grid`` the window's; tokens
padded in to fill a border window are left out as keys through a key-padding mask.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

__all__ = ["Windows", "window_layout", "layer_windows", "windowed_mix", "windowed_probs"]

Grid = Tuple[int, int]


class Windows(NamedTuple):
    """How an (h, w) grid is cut: window ``size`` per axis, ``pad`` (top, bottom, left, right) in tokens."""

    grid: Grid
    size: Grid
    pad: Tuple[int, int, int, int]

    @property
    def counts(self) -> Grid:
        """Windows per axis."""
        (top, bottom, left, right), (h, w) = self.pad, self.grid
        return (h + top + bottom) // self.size[0], (w + left + right) // self.size[1]

    def index(self, device=None) -> torch.Tensor:  # type: ignore[override]  # public API, shadows tuple.index
        """The window of each grid token, row-major: (h * w,)."""
        rows = (torch.arange(self.grid[0], device=device) + self.pad[0]) // self.size[0]
        cols = (torch.arange(self.grid[1], device=device) + self.pad[2]) // self.size[1]
        return (rows[:, None] * self.counts[1] + cols[None, :]).flatten()

    def partition(self, t: torch.Tensor) -> torch.Tensor:
        """Grid tokens (..., h*w, D) -> windows (..., n_windows, wh*ww, D), zero-padded."""
        (nh, nw), (wh, ww) = self.counts, self.size
        top, bottom, left, right = self.pad
        g = F.pad(t.unflatten(-2, self.grid), (0, 0, left, right, top, bottom))
        return g.unflatten(-3, (nh, wh)).unflatten(-2, (nw, ww)).transpose(-4, -3).flatten(-3, -2).flatten(-4, -3)

    def merge(self, t: torch.Tensor) -> torch.Tensor:
        """Windows (..., n_windows, wh*ww, D) -> grid tokens (..., h*w, D), padding dropped."""
        (nh, nw), (wh, ww), (h, w) = self.counts, self.size, self.grid
        g = t.unflatten(-3, (nh, nw)).unflatten(-2, (wh, ww)).transpose(-4, -3).flatten(-5, -4).flatten(-3, -2)
        return g[..., self.pad[0] : self.pad[0] + h, self.pad[2] : self.pad[2] + w, :].flatten(-3, -2)


def window_layout(grid: Grid, window_size: int, shifted: bool = False) -> Windows:
    """Windows of ``window_size`` (clipped to the grid per axis); ``shifted`` moves the borders by w // 2.

    Padding the front by w - w // 2 gives the partition Swin reaches with a cyclic shift and its
    attention mask (first window w // 2 wide); the rest is padded at the back.
    """
    sizes, pads = [], []
    for g in grid:
        w = min(window_size, g)
        front = w - w // 2 if shifted and g > w and w > 1 else 0
        sizes.append(w)
        pads += [front, -(g + front) % w]
    return Windows((grid[0], grid[1]), (sizes[0], sizes[1]), (pads[0], pads[1], pads[2], pads[3]))


def layer_windows(layer: Any, num_tokens: int) -> Windows:
    """The windows ``layer`` cuts the current input's grid into (shifted on odd ``block_index``)."""
    assert layer.window is not None
    shifted = layer.window_shift and layer.block_index % 2 == 1
    return window_layout(layer.current_grid(num_tokens), layer.window, shifted)


def _to_windows(t: torch.Tensor, layout: Windows) -> torch.Tensor:
    """(B, H, N, D) -> (B * windows, H, L, D)."""
    w = layout.partition(t).transpose(1, 2)  # (B, nw, H, L, D)
    return w.reshape(-1, *w.shape[2:])  # -1: the batch of windows stays dynamic in the TorchScript ONNX exporter


def windowed_mix(
    layer: Any,
    x: torch.Tensor,
    q: Optional[torch.Tensor],
    k: Optional[torch.Tensor],
    v: torch.Tensor,
    logit_noise: float,
) -> torch.Tensor:
    """``layer.mix`` run on each window of the grid: (B, H, N, D) -> (B, H, N, D)."""
    B, H, N, D = v.shape
    layout = layer_windows(layer, N)
    if layout.size == layout.grid:  # one window holds the grid: the mechanism sees the input as it is
        return layer.mix(x, q, k, v, None, False, logit_noise)
    keep = layout.partition(torch.ones(N, 1, dtype=torch.bool, device=v.device)).squeeze(-1)  # (nw, L)
    mask = None
    if any(layout.pad):  # border windows hold padding (known from the shapes: no data-dependent branch)
        if layer.no_mask is not None:
            raise ValueError(
                f"{type(layer).__name__} in windows of {layer.window}: the {layout.grid[0]}x{layout.grid[1]} grid "
                f"needs padded border windows, and the padding cannot be left out ({layer.no_mask}); give an input "
                f"whose grid the windows tile, or a window that tiles it"
            )
        mask = keep.repeat(B, 1)[:, None, None, :]  # (B * nw, 1, 1, L)
    windows = keep.shape[0]
    xw = _to_windows(x.unsqueeze(1), layout).squeeze(1)  # (B * nw, L, C)
    qw, kw = (None if t is None else _to_windows(t, layout) for t in (q, k))
    grid, layer.token_grid = layer.token_grid, layout.size
    try:
        out = layer.mix(xw, qw, kw, _to_windows(v, layout), mask, False, logit_noise)
    except ValueError as err:
        if mask is None:
            raise
        raise ValueError(
            f"{type(layer).__name__} in windows of {layer.window}: the {layout.grid[0]}x{layout.grid[1]} grid needs "
            f"padded border windows, and {err}"
        ) from None
    finally:
        layer.token_grid = grid
    return layout.merge(out.unflatten(0, (B, windows)).transpose(1, 2))


def windowed_probs(
    layer: Any, x: torch.Tensor, q: Optional[torch.Tensor], k: Optional[torch.Tensor], query_index: torch.Tensor
) -> torch.Tensor:
    """The implied (B, H, Q, N) matrix of ``layer`` in its windows: each query's row of its window's ``probs`` at
    the window's tokens, 0 elsewhere."""
    B, N, _ = x.shape
    layout = layer_windows(layer, N)
    if layout.size == layout.grid:
        return layer.probs(x, q, k, None, False, query_index)
    where = layout.partition(torch.arange(1, N + 1, device=x.device)[:, None]).squeeze(-1) - 1  # -1: padding
    mask = (where >= 0).repeat(B, 1)[:, None, None, :] if any(layout.pad) else None
    windows, L = where.shape
    xw = _to_windows(x.unsqueeze(1), layout).squeeze(1)
    grid, layer.token_grid = layer.token_grid, layout.size
    try:
        qw, kw = (None if t is None else _to_windows(t, layout) for t in (q, k))
        local = layer.probs(xw, qw, kw, mask, False, torch.arange(L, device=x.device))
    finally:
        layer.token_grid = grid
    where = where.masked_fill(where < 0, N)  # padding lands in a spare row and column, cut below
    full = local.new_zeros(B, local.shape[1], N + 1, N + 1)
    full[:, :, where[:, :, None], where[:, None, :]] = local.unflatten(0, (B, windows)).transpose(1, 2)
    return full[:, :, query_index, :N]
