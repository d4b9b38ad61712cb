"""Linformer (Wang et al. 2020): keys and values projected along the token axis (docs/mechanisms.md, section 9)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..options import is_count
from . import functional as AF
from .grid import GridBoundAttention, GridModule, Layout, resample_tokens
from .registry import register_attention

__all__ = ["LinformerAttention", "TokenProjection", "linformer_attention", "linformer_probs", "resample_projection"]


def resample_projection(t: torch.Tensor, src: Layout, dst: Layout) -> torch.Tensor:
    """Token axis (last) of a projection from ``src`` to ``dst``: prefix columns kept, grid columns
    bilinear times (src grid tokens / dst grid tokens), so each row keeps its mass over the image."""
    if src == dst:
        return t
    out = resample_tokens(t, -1, src, dst)
    mass = (src.h * src.w) / (dst.h * dst.w)
    return torch.cat([out[..., : dst.prefix], out[..., dst.prefix :] * mass], dim=-1)


class TokenProjection(GridModule):
    """E in R^(k x n): ``proj_len`` rows of weights over the built tokens (std 1/sqrt(n): E K keeps K's scale)."""

    def __init__(self, proj_len: int, layout: Layout, device=None, dtype=None):
        super().__init__(layout, device)
        self.weight = nn.Parameter(
            torch.randn(proj_len, layout.tokens, device=device, dtype=dtype) * layout.tokens**-0.5
        )

    def forward(self, layout: Layout) -> torch.Tensor:
        """E at ``layout``: (k, tokens of layout), fp32 or wider."""
        return resample_projection(AF.acc(self.weight), self.built, layout)

    def resample_state(self, state, prefix, src):
        key = prefix + "weight"
        if key in state:
            state[key] = resample_projection(AF.acc(state[key]), src, self.built).to(state[key].dtype)


def _along_tokens(e: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """E T for T of shape (B, H, n, d): tokens summed in fp32 or wider, returned in T's dtype."""
    return (e @ AF.acc(t)).to(t.dtype)


def linformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    e: torch.Tensor,
    f: torch.Tensor,
    scale: Optional[float] = None,
    logit_noise: float = 0.0,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """softmax(Q (E K)^T scale) (F V) with E, F of shape (k, n): O(n k d) per head."""
    return AF.softmax_attention(
        q, _along_tokens(e, k), _along_tokens(f, v), scale=scale, logit_noise=logit_noise, dropout_p=dropout_p
    )


def linformer_probs(
    q: torch.Tensor, k: torch.Tensor, e: torch.Tensor, f: torch.Tensor, scale: Optional[float] = None
) -> torch.Tensor:
    """Each token's share of a query's mix: |softmax(Q (E K)^T scale) F|, rows normalised (B, H, Nq, N).

    The implied matrix itself is signed (F is), so, as for Hydra, the diagnostics see the absolute
    weights as a distribution (docs/mechanisms.md section 9)."""
    weight = (AF.softmax_probs(q, _along_tokens(e, k), scale) @ AF.acc(f)).abs()
    return weight / weight.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weight.dtype).tiny)


@register_attention("linformer")
class LinformerAttention(GridBoundAttention):
    """softmax(Q (E K)^T / sqrt(d)) (F V), E, F in R^(proj_len x n) shared by the heads of a layer.

    n is the built token count; at another layout E and F are resampled over the patch grid
    (``interpolate``; prefix columns kept, grid columns keep their mass). Logit noise goes on the
    n x proj_len logits. ``scale`` is ``sqrt_d`` only: the softmax always has proj_len keys.
    """

    no_rope = (
        "its keys are projected along the tokens to a fixed number of rows, which have no grid position to turn "
        "by; use attention='softmax' or 'nystrom' with rope"
    )
    no_mask = no_causal = "each projected key mixes all tokens; use attention='softmax' for masked or causal inputs"
    no_padding = "each projected key mixes all tokens, the padded ones too"

    resampled = "projections E, F"

    def __init__(self, dim: int, num_heads: int = 8, *args, proj_len: int = 64, scale: str = "sqrt_d", **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        if not is_count(proj_len):
            raise ValueError(f"proj_len (the k projected tokens) must be a positive integer, got {proj_len!r}")
        proj_len = int(proj_len)
        if scale != "sqrt_d":
            raise ValueError(
                f"scale={scale!r}: linformer's softmax runs over proj_len={proj_len} projected keys at "
                f"every resolution, so only scale: sqrt_d applies"
            )
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.e = TokenProjection(int(proj_len), self.built_layout, **dd)
        self.f = TokenProjection(int(proj_len), self.built_layout, **dd)

    def projections_at(self, num_tokens: int):
        """E, F at the layout of an input of ``num_tokens`` tokens."""
        layout = self.target_layout(num_tokens)
        return self.e(layout), self.f(layout)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        return linformer_attention(
            q, k, v, *self.projections_at(k.shape[-2]), logit_noise=logit_noise, dropout_p=self.dropout_p
        )

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        return linformer_probs(q[:, :, query_index], k, *self.projections_at(k.shape[-2]))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", proj_len={self.e.weight.shape[0]}"
