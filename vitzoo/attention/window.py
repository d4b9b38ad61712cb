"""Window attention (Swin-style): softmax within non-overlapping w x w windows of the patch grid.

Shifted windows (alternate blocks) are the Swin partition; prefix (class) tokens are global. The
mathematics, cost and resolution behaviour are in docs/mechanisms.md, section 13.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..options import is_count
from . import functional as AF
from .base import ZooAttention
from .registry import register_attention
from .windowed import window_layout

__all__ = ["WindowAttention", "window_attention", "window_probs", "relative_index"]

Grid = Tuple[int, int]


def relative_index(rows: torch.Tensor, cols: torch.Tensor, window_size: int) -> torch.Tensor:
    """Swin's relative-position index of every pair of tokens at (rows, cols): (dy + w - 1) (2w - 1) + dx + w - 1,
    clamped into the table (pairs farther apart than a window are never attended)."""
    span, reach = 2 * window_size - 1, window_size - 1
    dy = (rows[:, None] - rows[None, :]).clamp(-reach, reach)
    dx = (cols[:, None] - cols[None, :]).clamp(-reach, reach)
    return (dy + reach) * span + dx + reach


def _grid_coords(size: Grid, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of each token of an h x w grid, row-major."""
    rows = torch.arange(size[0], device=device)[:, None].expand(size).flatten()
    return rows, torch.arange(size[1], device=device)[None, :].expand(size).flatten()


def _relative_bias(table: torch.Tensor, size: Grid, window_size: int, num_prefix: int, like: torch.Tensor):
    """(H, L, L + P): the table's entry of each pair of an h x w window's tokens, 0 for the prefix keys."""
    bias = table[relative_index(*_grid_coords(size, like.device), window_size)].permute(2, 0, 1).to(like.dtype)
    return F.pad(bias, (0, num_prefix))


def window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grid: Grid,
    window_size: int = 7,
    shifted: bool = False,
    num_prefix: int = 0,
    train_keys: Optional[int] = None,
    logit_noise: float = 0.0,
    dropout_p: float = 0.0,
    rel_table: Optional[torch.Tensor] = None,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Patch queries: softmax over their window's keys and the prefix keys; prefix queries: over all keys.

    O(n (w^2 + P) d) time. ``train_keys``: None for 1/sqrt(d), else the log-n scale's reference count.
    ``rel_table``: Swin's relative position bias table ((2w - 1)^2, H) on the window logits, or None.
    ``key_mask`` ((B or 1, 1, N) bool): padded keys get no weight and are not counted (a window of padding alone
    lets its padded queries attend its padding, so no softmax is empty; in an image with no key every row is 0).
    """
    P = num_prefix
    layout = window_layout(grid, window_size, shifted)
    qw, kw, vw = (layout.partition(t[:, :, P:]) for t in (q, k, v))
    keep = layout.partition(torch.ones(grid[0] * grid[1], 1, dtype=torch.bool, device=q.device)).squeeze(-1)
    if key_mask is not None:  # (nw, L) -> (B or 1, 1, nw, L)
        keep = keep & layout.partition(key_mask[..., P:].unsqueeze(-1)).squeeze(-1)
    if P:
        nw = keep.shape[-2]
        kw = torch.cat([kw, k[:, :, None, :P].expand(-1, -1, nw, -1, -1)], dim=-2)
        vw = torch.cat([vw, v[:, :, None, :P].expand(-1, -1, nw, -1, -1)], dim=-2)
        prefix_keep = keep.new_ones(nw, P) if key_mask is None else key_mask[..., None, :P].expand(-1, -1, nw, -1)
        keep = torch.cat([keep, prefix_keep], dim=-1)
    heads, windows = qw.shape[1:3]  # (B, H, windows, ...) as 4-D (B, H * windows, ...): what the ONNX SDPA takes
    if key_mask is None:
        scale = AF.query_scale(q, keep.sum(-1).view(-1, 1, 1), train_keys)
        mask = keep[:, None].repeat(heads, 1, 1)
        if rel_table is not None:
            bias = _relative_bias(rel_table, layout.size, window_size, P, q)[:, None]  # (H, 1, L, S)
            mask = torch.where(keep[None, :, None, :], bias, float("-inf")).flatten(0, 1)
    else:
        keep = keep | (~keep.any(-1, keepdim=True) & key_mask.any(-1)[..., None, None])  # not for an image with no key
        scale = AF.query_scale(q, keep.sum(-1)[..., None, None], train_keys)
        mask = keep.unsqueeze(-2)  # (B or 1, 1, nw, 1, S)
        if rel_table is not None:
            mask = torch.where(mask, _relative_bias(rel_table, layout.size, window_size, P, q)[:, None], float("-inf"))
        mask = mask.expand(-1, heads, -1, -1, -1).flatten(1, 2)
    mixed = AF.softmax_attention(
        (qw * scale).flatten(1, 2), kw.flatten(1, 2), vw.flatten(1, 2), 1.0, logit_noise, mask, dropout_p=dropout_p
    )
    out = layout.merge(mixed.unflatten(1, (heads, windows)))
    if not P:
        return out
    if key_mask is None:
        scale = AF.query_scale(q, k.shape[-2], train_keys)
        prefix = AF.softmax_attention(q[:, :, :P], k, v, scale, logit_noise, dropout_p=dropout_p)
    else:  # each image's own count: a tensor scale, on the queries
        scale = AF.query_scale(q, AF.key_count(key_mask, k), train_keys)
        mask = key_mask.unsqueeze(-2)
        prefix = AF.softmax_attention(q[:, :, :P] * scale, k, v, 1.0, logit_noise, mask, dropout_p=dropout_p)
    return torch.cat([prefix, out], dim=2)


def window_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    grid: Grid,
    query_index: torch.Tensor,
    window_size: int = 7,
    shifted: bool = False,
    num_prefix: int = 0,
    train_keys: Optional[int] = None,
    rel_table: Optional[torch.Tensor] = None,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The implied n x n matrix (rows ``query_index``): zero outside each query's window and the prefix (and on the
    keys ``key_mask`` pads)."""
    ids = window_layout(grid, window_size, shifted).index(q.device)
    ids = torch.cat([ids.new_full((num_prefix,), -1), ids])
    keep = (ids[:, None] == ids[None, :]) | (ids[:, None] < 0) | (ids[None, :] < 0)
    if key_mask is not None:  # (B or 1, 1, N, N)
        keep = keep & key_mask.unsqueeze(-2)
        keep = keep | (~keep.any(-1, keepdim=True) & key_mask.any(-1)[..., None, None])  # not for an image with no key
    mask = keep
    if rel_table is not None:
        bias = F.pad(_relative_bias(rel_table, grid, window_size, 0, AF.acc(q)), (num_prefix, 0, num_prefix, 0))
        mask = torch.where(keep, bias, float("-inf"))
    keep, mask = keep[..., query_index, :], mask[..., query_index, :]
    scale = AF.query_scale(q, keep.sum(-1, keepdim=True), train_keys)
    return AF.softmax_probs(q[:, :, query_index] * scale, k, 1.0, mask)


@register_attention("window")
class WindowAttention(ZooAttention):
    """Softmax within ``window_size`` windows; with ``shift``, odd blocks (``block_index``) use shifted windows.

    Prefix tokens attend every token and every token attends them. ``rel_pos``: Swin's learned relative position
    bias per head on the window logits (prefix keys get none). ``scale: log_n`` counts the keys each query attends
    (window keys + prefix); its reference is a full window at the build grid. A key-padding ``attn_mask``: padded keys
    get no weight and are not counted; in a variable-size batch every image must be cut into the windows the canvas
    has at its place (else a one-line refusal).
    """

    rope_form = "rotate"  # positions on the whole grid: each window's scores see offsets
    no_window = "it is window attention already; set its window_size"
    no_causal = "its mask is the window partition; use attention='softmax' for causal inputs"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        window_size: int = 7,
        shift: bool = True,
        rel_pos: bool = False,
        scale: str = "sqrt_d",
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        if not is_count(window_size):
            raise ValueError(f"window_size must be a positive integer (tokens per window side), got {window_size!r}")
        self.window_size, self.shift, self.scale_mode = int(window_size), bool(shift), scale
        if scale == "log_n" and self.grid_size is None:
            raise ValueError(
                "scale='log_n' needs the training grid: build window attention inside a vitzoo model "
                "or pass grid_size=(h, w)"
            )
        self.train_keys = None
        if scale == "log_n":
            assert self.grid_size is not None  # checked just above
            self.train_keys = self.num_prefix_tokens + math.prod(window_layout(self.grid_size, self.window_size).size)
        AF.check_scale(scale, self.train_keys)
        if not isinstance(rel_pos, bool):
            raise ValueError(f"window rel_pos={rel_pos!r}; give true or false")
        self.rel_table = None
        if rel_pos:
            self.rel_table = nn.Parameter(
                torch.empty(
                    (2 * self.window_size - 1) ** 2, num_heads, device=kwargs.get("device"), dtype=kwargs.get("dtype")
                )
            )
            nn.init.trunc_normal_(self.rel_table, std=0.02)
        self.register_load_state_dict_pre_hook(WindowAttention._timm_table_name)

    def _timm_table_name(self, state_dict: dict, prefix: str, *args) -> None:
        """Read timm's Swin ``relative_position_bias_table`` as ``rel_table``."""
        if f"{prefix}relative_position_bias_table" in state_dict:
            state_dict[f"{prefix}rel_table"] = state_dict.pop(f"{prefix}relative_position_bias_table")

    @property
    def shifted(self) -> bool:
        """Whether this layer uses the shifted partition (Swin: every second block)."""
        return self.shift and self.block_index % 2 == 1

    def _options(self, num_tokens: int) -> dict:
        return dict(
            grid=self.current_grid(num_tokens),
            window_size=self.window_size,
            shifted=self.shifted,
            num_prefix=self.num_prefix_tokens,
            train_keys=self.train_keys,
            rel_table=self.rel_table,
        )

    def key_padding(self, attn_mask: Optional[torch.Tensor], grid: Grid) -> Optional[torch.Tensor]:
        """The key mask of ``attn_mask``; in a variable-size batch, a refusal unless each image's windows are the
        canvas's at its place (the same window size and shifted border per axis)."""
        for image in self.image_grids or ():
            own, canvas = (window_layout(g, self.window_size, self.shifted) for g in (image, grid))
            if own.size != canvas.size or own.pad[::2] != canvas.pad[::2]:
                raise ValueError(
                    f"window: an image of grid {image} is cut into other windows than the batch's {grid} canvas (a "
                    f"side up to window_size={self.window_size}); batch images whose sides exceed window_size, or "
                    "lower window_size"
                )
        return AF.key_padding(attn_mask)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        options = self._options(q.shape[-2])
        keys = self.key_padding(attn_mask, options["grid"])
        return window_attention(q, k, v, logit_noise=logit_noise, dropout_p=self.dropout_p, key_mask=keys, **options)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        options = self._options(q.shape[-2])
        keys = self.key_padding(attn_mask, options["grid"])
        return window_probs(q, k, query_index=query_index, key_mask=keys, **options)

    def extra_repr(self) -> str:
        return (
            super().extra_repr() + f", window_size={self.window_size}, shift={self.shift}, "
            f"rel_pos={self.rel_table is not None}, scale={self.scale_mode}"
        )
