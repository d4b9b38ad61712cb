"""Softmax (scaled dot-product) attention, with the entropy-invariant log-n scale (docs/mechanisms.md sections 1-2)."""

from __future__ import annotations

from typing import Optional

import torch

from . import functional as AF
from .base import ZooAttention
from .registry import register_attention

__all__ = ["SoftmaxAttention"]


@register_attention("softmax")
class SoftmaxAttention(ZooAttention):
    """softmax(q k^T * scale) v; ``fused`` uses SDPA, the eager twin materialises the matrix."""

    rope_form = "rotate"
    no_sr: Optional[str] = None

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        scale: str = "sqrt_d",
        train_tokens: Optional[int] = None,
        fused: bool = True,
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.scale_mode = scale
        self.train_tokens = train_tokens or self.num_tokens
        AF.check_scale(scale, self.train_tokens)
        self.fused = fused

    @property
    def uses_log_n(self) -> bool:
        return self.scale_mode == "log_n"

    def logit_scale(self, num_keys: int) -> float:
        return AF.logit_scale(self.scale_mode, self.head_dim, num_keys, self.train_tokens)

    def scaled_queries(self, q: torch.Tensor, k: torch.Tensor, attn_mask: Optional[torch.Tensor]):
        """(q, scale) for the logits. The log-n scale counts the keys each query attends (docs/mechanisms.md
        section 1): under a mask that differs by query, so it is folded into q's rows (scale 1)."""
        counts = AF.attended_keys(attn_mask) if self.uses_log_n else None
        if counts is None:
            return q, self.logit_scale(k.shape[-2])
        return q * AF.query_scale(q, counts, self.train_tokens), 1.0

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        if is_causal:
            attn_mask = AF.causal_mask(q, k, attn_mask)
        q, scale = self.scaled_queries(q, k, attn_mask)
        return AF.softmax_attention(
            q,
            k,
            v,
            scale=scale,
            logit_noise=logit_noise,
            attn_mask=attn_mask,
            fused=self.fused,
            dropout_p=self.dropout_p,
        )

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        if is_causal:
            attn_mask = AF.causal_mask(q, k, attn_mask)
        if attn_mask is not None:
            attn_mask = attn_mask[..., query_index, :] if attn_mask.shape[-2] > 1 else attn_mask
        q, scale = self.scaled_queries(q[:, :, query_index], k, attn_mask)
        return AF.softmax_probs(q, k, scale, attn_mask)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", scale={self.scale_mode}, fused={self.fused}"
