"""Kernel (linear) attention: elu+1, relu and Taylor 1+cos feature maps (seed 001)."""
from __future__ import annotations

from . import functional as AF
from .base import ZooAttention
from .feature_maps import feature_map as _check_feature_map
from .registry import register_attention

__all__ = ["LinearAttention"]


@register_attention("taylor", feature_map="taylor")
@register_attention("linear")
class LinearAttention(ZooAttention):
    """out_i = phi(q_i) sum_j phi(k_j)^T v_j / (phi(q_i).sum_j phi(k_j) + eps), O(n d^2).

    Logit noise becomes the per-key factor exp(eps_j) on phi(k_j) (ATTENTION.md section 6).
    ``impl`` picks the path (auto | triton | torch | eager, see ``functional.linear_attention``).
    """

    has_logits = False

    def __init__(self, dim: int, num_heads: int = 8, *args, feature_map: str = "elu", eps: float = 1e-6,
                 causal: bool = False, impl: str = "auto", **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        _check_feature_map(feature_map)
        if impl not in AF.LINEAR_IMPLS:
            raise ValueError(f"unknown impl={impl!r}; choose one of {list(AF.LINEAR_IMPLS)}")
        self.feature_map, self.eps, self.causal, self.impl = feature_map, eps, causal, impl

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        _no_mask(attn_mask)
        return AF.linear_attention(q, k, v, self.feature_map, self.eps, self.impl,
                                   self.causal or is_causal, logit_noise)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        _no_mask(attn_mask)
        if self.causal or is_causal:
            return AF.kernel_probs(q, k, self.feature_map, self.eps, causal=True)[:, :, query_index]
        return AF.kernel_probs(q[:, :, query_index], k, self.feature_map, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", feature_map={self.feature_map}, causal={self.causal}, impl={self.impl}"


def _no_mask(attn_mask) -> None:
    if attn_mask is not None:
        raise ValueError("kernel attention takes no attn_mask (it never forms the n x n matrix); "
                         "use attention='softmax' for masked inputs")
