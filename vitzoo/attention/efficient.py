"""Efficient Attention (Shen et al.): the softmax-split form of docs/mechanisms.md section 3."""

from __future__ import annotations

from typing import Optional

from . import functional as AF
from .base import ZooAttention
from .decoupled import decoupled_attention, decoupled_probs
from .registry import register_attention

__all__ = ["EfficientAttention"]


@register_attention("efficient")
class EfficientAttention(ZooAttention):
    """softmax over channels of each query times (softmax over tokens of each key channel)^T v.

    Logit noise is one eps_j per key added to all its channels before the softmax over tokens. A key-padding
    ``attn_mask`` leaves the padded keys out of the softmax over tokens. ``rope`` takes the decoupled form: the two
    softmax factors turned in the numerator; the plain normaliser is softmax_D(q_i) . sum_j softmax_N(k)_j = 1 (0 for
    an image with no key: + ``GUARD_EPS``).
    """

    rope_form = "decoupled"
    has_logits = False
    no_sr: Optional[str] = None
    no_causal = "it has no causal form; use attention='linear' with causal: true"

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        if self.rope is not None:
            qs, ks = AF._efficient_factors(q, k, logit_noise, AF.key_padding(attn_mask))
            return decoupled_attention(qs, ks, self.rope_angles(qs.shape[-2], qs), v, AF.GUARD_EPS, num_keys=1)
        return AF.efficient_attention(q, k, v, logit_noise, AF.key_padding(attn_mask))

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        if self.rope is not None:
            qs, ks = AF._efficient_factors(q, k, 0.0, AF.key_padding(attn_mask))
            return decoupled_probs(qs, ks, self.rope_angles(qs.shape[-2], qs), query_index)
        return AF.efficient_probs(q[:, :, query_index], k, key_mask=AF.key_padding(attn_mask))
