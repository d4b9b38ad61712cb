"""Kernel (linear) attention with any feature map: elu+1, relu, Taylor 1+cos, or a registered module."""

from __future__ import annotations

from typing import Optional

from . import functional as AF
from .base import ZooAttention
from .decoupled import decoupled_linear, decoupled_probs
from .feature_maps import FeatureMapSpec, build_feature_map
from .registry import register_attention

__all__ = ["LinearAttention"]


@register_attention("taylor", feature_map="taylor")
@register_attention("linear")
class LinearAttention(ZooAttention):
    """out_i = phi(q_i) sum_j phi(k_j)^T v_j / (phi(q_i).sum_j phi(k_j) + eps), O(n d^2).

    ``feature_map`` is a spec (a name or ``{"name": ..., options}``, see ``feature_maps``); maps the
    kernels know run fully fused, others hand their features to the same O(n) path. Logit noise
    becomes the per-key factor exp(eps_j) on phi(k_j) (docs/mechanisms.md). ``impl`` picks the path
    (auto | triton | torch | eager, see ``functional.linear_attention``). A key-padding ``attn_mask`` leaves the
    padded keys out of both sums (``functional.key_padding``).
    """

    has_logits = False
    no_sr: Optional[str] = None

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        feature_map: FeatureMapSpec = "elu",
        eps: float = 1e-6,
        causal: bool = False,
        impl: str = "auto",
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        if impl not in AF.LINEAR_IMPLS:
            raise ValueError(f"unknown impl={impl!r}; choose one of {list(AF.LINEAR_IMPLS)}")
        self.phi = build_feature_map(feature_map, self.head_dim, num_heads)
        self.eps, self.causal, self.impl = eps, causal, impl
        self.rope_form = self.phi.rope_form
        if self.causal and self.sr is not None:
            raise ValueError("causal with sr_ratio / sr_pool: reduced keys have no order; drop one of them")
        if self.rope is not None and self.rope_form == "decoupled":
            self.check_decoupled_rope()

    def check_decoupled_rope(self) -> None:
        """Decoupled RoPE turns the head's feature channels by the head's table, in the non-causal form only."""
        if self.causal:
            raise ValueError("rope with causal: decoupled RoPE has no causal form yet; drop causal or rope")
        if self.phi.feature_dim != self.head_dim:
            raise ValueError(
                f"rope: decoupled RoPE turns the features by the head's table, so the feature map must give head_dim="
                f"{self.head_dim} features, and {type(self.phi).__name__} gives {self.phi.feature_dim}; set its "
                "num_features, or use feature_map elu / relu"
            )

    def decoupled_mix(self, fq, fk, name, v, keys, is_causal, logit_noise):
        """RoPE in the decoupled form: turned features in the numerator, plain ones in the normaliser (decoupled.py);
        padded keys (``keys``) are left out of both."""
        if is_causal:
            raise ValueError("rope with is_causal: decoupled RoPE has no causal form yet; drop rope or is_causal")
        fq, fk = AF._kernel_features(fq, fk, name, logit_noise, keys)
        angles = self.rope_angles(fq.shape[-2], fq)
        return decoupled_linear(fq, fk, angles, v, self.eps, self.impl, AF.key_count(keys, fk))

    def features(self, q, k, key_mask=None):
        """(q, k, name): the raw q, k and the fused map's name, or precomputed features and ``identity`` (a map whose
        features depend on all keys reads ``key_mask``)."""
        if self.phi.fused_map is not None:
            return q, k, self.phi.fused_map
        return self.phi(q, is_query=True), self.phi(k, is_query=False), "identity"

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        """Precomputed features are fp32 or wider while v may be half (autocast): the sums run in the features'
        dtype and the output comes back in v's, as with a fused map."""
        keys = AF.key_padding(attn_mask)
        fq, fk, name = self.features(q, k, keys)
        if self.rope is not None and self.rope_form == "decoupled":
            return self.decoupled_mix(fq, fk, name, v, keys, is_causal, logit_noise)
        out = AF.linear_attention(
            fq, fk, v.to(fq.dtype), name, self.eps, self.impl, self.causal or is_causal, logit_noise, keys
        )
        return out.to(v.dtype)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        keys = AF.key_padding(attn_mask)
        fq, fk, name = self.features(q, k, keys)
        if self.rope is not None and self.rope_form == "decoupled":
            fq, fk = AF._kernel_features(fq, fk, name, 0.0, keys)
            return decoupled_probs(fq, fk, self.rope_angles(fq.shape[-2], fq), query_index)
        if self.causal or is_causal:
            return AF.kernel_probs(fq, fk, name, self.eps, causal=True, key_mask=keys)[:, :, query_index]
        return AF.kernel_probs(fq[:, :, query_index], fk, name, self.eps, key_mask=keys)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", causal={self.causal}, impl={self.impl}"
