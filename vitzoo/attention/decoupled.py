"""Decoupled RoPE for kernel attention: the numerator mixes rotated features, the normaliser does not.

    o_i = (R_i f(q_i))^T S_r / (f(q_i) . z + n eps),   S_r = sum_j (R_j f(k_j)) v_j^T,   z = sum_j f(k_j)

(eps is relative to the mean of the keys, as in MLLA's and RALA's code). O(n d^2) per head; the eager twin forms
the n x n weights. The rotations are 2-D RoPE of the patch grid in pairs of adjacent channels (``rope.rotate_all``);
prefix (class / register) tokens are not rotated. Any table of ``vitzoo.attention.rope`` works (the ``rope`` option
of the kernel forms); MLLA and RALA also have their own: MLLA's (across all H*d channels before the head split, so
each head turns along one axis) and RALA's (per head: half the pairs by row, half by column), with integer grid
indices of the input's own grid, so a larger input extrapolates (docs/mechanisms.md, sections 16, 17 and 20).
"""

from __future__ import annotations

from typing import Tuple, Union

import torch

from . import functional as AF
from .base import ZooAttention
from .grid_conv import grid_conv
from .rope import rotate_all

__all__ = [
    "mlla_angles",
    "rala_angles",
    "DECOUPLED_IMPLS",
    "decoupled_attention",
    "decoupled_attention_eager",
    "decoupled_linear",
    "decoupled_probs",
    "positive_features",
    "DecoupledRopeAttention",
]

Grid = Tuple[int, int]


def _grid_positions(grid: Grid, prefix: int, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row and column index of every token (prefix tokens: position 0 on both axes, i.e. no rotation)."""
    rows = torch.arange(grid[0], device=like.device, dtype=like.dtype).repeat_interleave(grid[1])
    cols = torch.arange(grid[1], device=like.device, dtype=like.dtype).repeat(grid[0])
    zeros = rows.new_zeros(prefix)
    return torch.cat([zeros, rows]), torch.cat([zeros, cols])


def mlla_angles(grid: Grid, prefix: int, num_heads: int, head_dim: int, like: torch.Tensor) -> torch.Tensor:
    """MLLA's table over C = H*d channels: pair m < C/4 turns by row * theta_m, pair m >= C/4 by
    column * theta_(m - C/4), theta_k = 10000^(-k / (C/4)); cut into heads: (H, n, d/2) in ``like``'s dtype."""
    quarter = num_heads * head_dim // 4
    theta = 10000.0 ** -(torch.arange(quarter, device=like.device, dtype=like.dtype) / quarter)
    rows, cols = _grid_positions(grid, prefix, like)
    angles = torch.cat([rows[:, None] * theta, cols[:, None] * theta], dim=-1)  # (n, C/2), pair m of channel 2m
    return angles.unflatten(-1, (num_heads, head_dim // 2)).transpose(0, 1)


def rala_angles(grid: Grid, prefix: int, head_dim: int, like: torch.Tensor) -> torch.Tensor:
    """RALA's table per head: pairs of channels [0, d/2) turn by row * omega_k, those of [d/2, d) by column *
    omega_k, omega_k = 10000^(-k / (d/4 - 1)) (exponents linspace(0, 1, d/4)); (1, n, d/2) in ``like``'s dtype."""
    quarter = head_dim // 4
    omega = 10000.0 ** -(torch.arange(quarter, device=like.device, dtype=like.dtype) / max(quarter - 1, 1))
    rows, cols = _grid_positions(grid, prefix, like)
    return torch.cat([rows[:, None] * omega, cols[:, None] * omega], dim=-1).unsqueeze(0)


NumKeys = Union[int, torch.Tensor, None]


def _normaliser(fq: torch.Tensor, fk: torch.Tensor, eps: float, num_keys: NumKeys) -> torch.Tensor:
    """fq_i . sum_j fk_j + n eps, (B, H, n, 1); ``num_keys`` is n (the key count, or per image under key padding)."""
    n = fk.shape[-2] if num_keys is None else num_keys
    return fq @ fk.sum(dim=-2).unsqueeze(-1) + n * eps


def decoupled_attention(
    fq: torch.Tensor,
    fk: torch.Tensor,
    angles: torch.Tensor,
    v: torch.Tensor,
    eps: float = 1e-6,
    num_keys: NumKeys = None,
) -> torch.Tensor:
    """o_i = (R_i fq_i)^T sum_j (R_j fk_j) v_j^T / (fq_i . sum_j fk_j + n eps) for features fq, fk (B, H, n, d)
    in fp32 or wider (padded keys' features 0, ``num_keys`` their count); the output in v's dtype."""
    rq, rk = rotate_all(angles, fq, fk)
    state = rk.transpose(-2, -1) @ v.to(fq.dtype)
    return ((rq @ state) / _normaliser(fq, fk, eps, num_keys)).to(v.dtype)


def decoupled_attention_eager(
    fq: torch.Tensor,
    fk: torch.Tensor,
    angles: torch.Tensor,
    v: torch.Tensor,
    eps: float = 1e-6,
    num_keys: NumKeys = None,
) -> torch.Tensor:
    """``decoupled_attention``'s eager twin: the signed weights (R_i fq_i).(R_j fk_j) / (fq_i . z + n eps) as an
    n x n matrix, times v."""
    rq, rk = rotate_all(angles, fq, fk)
    num = rq @ rk.transpose(-2, -1)
    return ((num / _normaliser(fq, fk, eps, num_keys)) @ v.to(fq.dtype)).to(v.dtype)


DECOUPLED_IMPLS = ("auto", "torch", "eager")  # auto and torch: the O(n) torch path; Triton has no decoupled kernel


def decoupled_linear(
    fq: torch.Tensor,
    fk: torch.Tensor,
    angles: torch.Tensor,
    v: torch.Tensor,
    eps: float,
    impl: str,
    num_keys: NumKeys = None,
) -> torch.Tensor:
    """Decoupled RoPE on the path ``impl`` names (a kernel form's ``impl`` option: auto | torch | eager)."""
    if impl not in DECOUPLED_IMPLS:
        raise ValueError(
            f"impl={impl!r} with rope: decoupled RoPE has no Triton kernel yet; use impl='auto' (its O(n) torch path)"
        )
    if impl == "eager":
        return decoupled_attention_eager(fq, fk, angles, v, eps, num_keys)
    return decoupled_attention(fq, fk, angles, v, eps, num_keys)


def decoupled_probs(
    fq: torch.Tensor, fk: torch.Tensor, angles: torch.Tensor, query_index: torch.Tensor
) -> torch.Tensor:
    """Each key's share of a query's mix, |(R_i fq_i).(R_j fk_j)| with rows normalised (B, H, Q, n): the implied
    weights (R_i fq_i).(R_j fk_j) / (fq_i . z + n eps) are signed and their rows need not sum to 1."""
    rq, rk = rotate_all(angles, fq, fk)
    weight = (rq[:, :, query_index] @ rk.transpose(-2, -1)).abs()
    return weight / weight.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weight.dtype).tiny)


def positive_features(q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """elu(x) + 1 of q and k in fp32 or wider."""
    return torch.nn.functional.elu(AF.acc(q)) + 1.0, torch.nn.functional.elu(AF.acc(k)) + 1.0


class DecoupledRopeAttention(ZooAttention):
    """Kernel attention with decoupled RoPE plus LePE (a ``kernel_size`` depthwise conv of V on grid tokens; prefix
    rows get none); subclasses give the features and their own angle table (``features``), which a ``rope`` option
    replaces (``angles``). A key-padding ``attn_mask`` leaves the padded keys out of both sums and out of n, and shows
    them to LePE as 0."""

    has_logits = False
    rope_form = "decoupled"

    def __init__(self, dim: int, num_heads: int = 8, *args, kernel_size: int = 3, eps: float = 1e-6, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.eps = eps
        name = type(self).__name__
        self.lepe = grid_conv(name, self.attn_dim, kernel_size, device=kwargs.get("device"), dtype=kwargs.get("dtype"))

    def features(self, q: torch.Tensor, k: torch.Tensor, logit_noise: float = 0.0, key_mask=None):
        """(query features, key features, angles (H or 1, n, d/2)) in fp32 or wider; features that depend on all
        tokens read ``key_mask``."""
        raise NotImplementedError

    def own_angles(self, grid: Grid, like: torch.Tensor) -> torch.Tensor:
        """The mechanism's own table for ``grid`` (prefix rows 0): (H or 1, n, d/2) in ``like``'s dtype."""
        raise NotImplementedError

    def angles(self, fq: torch.Tensor) -> torch.Tensor:
        """The ``rope`` option's table for the current grid if set, else the mechanism's own."""
        if self.rope is not None:
            return self.rope_angles(fq.shape[-2], fq)
        return self.own_angles(self.current_grid(fq.shape[-2]), fq)

    def masked_features(self, q, k, attn_mask, logit_noise: float = 0.0):
        """``features`` with the padded keys' features 0, and the key mask of ``attn_mask``."""
        keys = AF.key_padding(attn_mask)
        fq, fk, angles = self.features(q, k, logit_noise, keys)
        return fq, AF.mask_keys(fk, keys), angles, keys

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        fq, fk, angles, keys = self.masked_features(q, k, attn_mask, logit_noise)
        out = decoupled_attention(fq, fk, angles, v, self.eps, None if keys is None else AF.key_count(keys, fk))
        if self.lepe is None:
            return out
        return out + self.lepe.over_grid(v, self.current_grid(v.shape[-2]), self.num_prefix_tokens, keys)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        fq, fk, angles, _ = self.masked_features(q, k, attn_mask)
        return decoupled_probs(fq, fk, angles, query_index)
