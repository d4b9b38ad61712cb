"""InLine attention (Han et al., NeurIPS 2024): injective linear attention, whose rows sum to 1 by subtracting the
row mean instead of dividing by the row sum, plus a local residual: a 3x3 depthwise conv of V whose kernels are
generated per image from the mean token. The mathematics: docs/mechanisms.md section 15.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .base import ZooAttention
from .registry import register_attention

__all__ = ["InLineAttention", "inline_attention", "inline_probs", "dynamic_depthwise"]


def _key_weights(k: torch.Tensor, noise: Optional[torch.Tensor]) -> torch.Tensor:
    """Each key's weight e_j (1 without noise, exp(eps_j) with it), (B, H, n, 1) in k's dtype."""
    return torch.ones_like(k[..., :1]) if noise is None else noise.exp().to(k.dtype)


def _inline_features(
    q: torch.Tensor, k: torch.Tensor, noise: Optional[torch.Tensor], key_mask: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Kernel features whose normalised attention is InLine's: [1, tau q_i] and e_j [1, k_j - kbar], kbar the
    e-weighted key mean, so sum_j e_j (k_j - kbar) = 0 and the normaliser is sum_j e_j exactly (e_j = 0 for the keys
    ``key_mask`` leaves out)."""
    q, k = AF.acc(q), AF.mask_keys(AF.acc(k), key_mask)
    e = AF.mask_keys(_key_weights(k, noise), key_mask)
    kbar = (e * k).sum(-2, keepdim=True) / e.sum(-2, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    tau = q.shape[-1] ** -0.5
    ones = torch.ones_like(q[..., :1])
    return torch.cat([ones, tau * q], -1), e * torch.cat([torch.ones_like(k[..., :1]), k - kbar], -1)


def inline_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    noise: Optional[torch.Tensor] = None,
    impl: str = "auto",
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """o_i = sum_j w_ij v_j, w_ij = 1/n + (tau/n) (q_i.k_j - q_i.kbar), i.e. o_i = vbar + tau q_i^T Cov(k, v), by
    the kernel path (``noise``: per-key log-factors eps_j weighting key j by exp(eps_j) in every mean; the means run
    over the keys of ``key_mask``)."""
    fq, fk = _inline_features(q, k, noise, key_mask)
    return AF.linear_attention(fq, fk, v.to(fq.dtype), "identity", AF.GUARD_EPS, impl).to(v.dtype)


def inline_probs(q: torch.Tensor, k: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """|w_ij| with rows normalised: each key's share of a query's mix (the weights themselves are signed)."""
    fq, fk = _inline_features(q, k, None, key_mask)
    weight = (fq @ fk.transpose(-2, -1)).abs()
    return weight / weight.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weight.dtype).tiny)


def dynamic_depthwise(images: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """A depthwise conv with one kernel per image and channel: (B, C, h, w) * (B, C, k, k), zero padding k // 2,
    as a sum of k^2 shifted products (no per-batch groups, so exporters keep the batch dynamic)."""
    size = kernels.shape[-1]
    r, (h, w) = size // 2, images.shape[-2:]
    padded = F.pad(images, (r, r, r, r))
    out = images.new_zeros(images.shape)
    for a in range(size):
        for b in range(size):
            out = out + kernels[:, :, a, b, None, None] * padded[:, :, a : a + h, b : b + w]
    return out


@register_attention("inline")
class InLineAttention(ZooAttention):
    """Injective linear attention (identity kernel) plus the local residual on grid tokens.

    The residual convolves V (all heads' channels) with 3x3 depthwise kernels generated from the mean of the
    layer's input over all tokens (a grouped 1x1 map per head, GELU, another to 9 values per channel; groups by
    head), with zero padding and no bias; prefix (class / register) tokens are queries and keys of the attention
    term and count in the mean, but get no residual. The normaliser is sum_j e_j (+ ``GUARD_EPS``, for an image
    with no key); logit noise weights key j by exp(eps_j) in every mean over keys (rows still sum to 1). A
    key-padding ``attn_mask`` leaves the padded tokens out of every mean (keys and the kernel generator's) and shows
    them to the conv as 0.
    """

    rope_form = "rotate"  # centred scores: each row still sums to 1
    has_logits = False
    no_causal = "its residual conv sees both sides; use attention='linear' with causal: true"

    def __init__(self, dim: int, num_heads: int = 8, *args, residual: bool = True, impl: str = "auto", **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        if impl not in AF.LINEAR_IMPLS:
            raise ValueError(f"unknown impl={impl!r}; choose one of {list(AF.LINEAR_IMPLS)}")
        if residual and dim % num_heads:
            raise ValueError(
                f"inline's kernel generator groups the {dim} input channels by head: "
                f"num_heads={num_heads} must divide dim (or set residual: false)"
            )
        self.impl = impl
        dd: Dict[str, Any] = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.kernel_gen = (
            nn.Sequential(
                nn.Conv1d(dim, self.attn_dim, 1, groups=num_heads, **dd),
                nn.GELU(),
                nn.Conv1d(self.attn_dim, 9 * self.attn_dim, 1, groups=num_heads, **dd),
            )
            if residual
            else None
        )

    def residual(self, x: torch.Tensor, v: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The local residual of every token (B, H, n, d); prefix rows 0."""
        B, H, N, D = v.shape
        prefix, grid = self.num_prefix_tokens, self.current_grid(N)
        assert self.kernel_gen is not None  # called only with residual=True
        mean = (
            x.mean(dim=1)
            if key_mask is None
            else AF.mask_keys(x, key_mask[:, 0]).sum(1) / key_mask.sum(-1).clamp_min(1)
        )
        kernels = self.kernel_gen(mean.unsqueeze(-1)).reshape(B, H * D, 3, 3)
        images = AF.mask_keys(v, key_mask)[:, :, prefix:].transpose(-2, -1).reshape(B, H * D, *grid)
        out = dynamic_depthwise(images, kernels.to(images.dtype)).reshape(B, H, D, N - prefix).transpose(-2, -1)
        return torch.cat([v.new_zeros(B, H, prefix, D), out], dim=2)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        keys = AF.key_padding(attn_mask)
        out = inline_attention(q, k, v, AF.key_noise(k, logit_noise), self.impl, keys)
        return out if self.kernel_gen is None else out + self.residual(x, v, keys)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        return inline_probs(q[:, :, query_index], k, AF.key_padding(attn_mask))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", residual={self.kernel_gen is not None}, impl={self.impl}"
