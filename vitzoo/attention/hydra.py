"""Hydra attention (Bolya et al. 2022): as many heads as channels with the cosine kernel, O(n d).
The mathematics: docs/mechanisms.md section 11.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from . import functional as AF
from .base import ZooAttention
from .registry import register_attention

__all__ = ["hydra_attention", "hydra_probs", "HydraAttention"]


def _unit(x: torch.Tensor) -> torch.Tensor:
    """phi(x): each token's vector of all H*D channels of (B, H, N, D) scaled to unit length (0 stays 0)."""
    x = AF.acc(x)
    return x / torch.linalg.vector_norm(x, dim=(1, 3), keepdim=True).clamp_min(1e-12)


def hydra_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logit_noise: float = 0.0,
    sum_scale: Union[float, torch.Tensor] = 1.0,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """out = phi(Q) * (sum_scale * sum_t phi(K_t) * V_t), channel by channel, the sum over the keys of ``key_mask``;
    logit noise is the factor exp(eps_t) on phi(K_t)."""
    fk = _unit(k)
    noise = AF.key_noise(k, logit_noise)
    if noise is not None:
        fk = fk * noise.exp()
    fk = AF.mask_keys(fk, key_mask)
    return (_unit(q) * ((fk * AF.acc(v)).sum(dim=-2, keepdim=True) * sum_scale)).to(v.dtype)


def hydra_probs(q: torch.Tensor, k: torch.Tensor, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Each key's share of a query's mix in a head: sum over its channels of |phi(q_i)_c phi(k_t)_c|, rows
    normalised (the per-channel weights are signed and unnormalised, docs/mechanisms.md)."""
    return AF.kernel_probs(_unit(q).abs(), _unit(k).abs(), "identity", eps=1e-12, key_mask=key_mask)


@register_attention("hydra")
class HydraAttention(ZooAttention):
    """Hydra: every channel is a head mixing with weights phi(q_i)_c phi(k_t)_c, no softmax, no denominator.

    ``num_heads`` / ``heads`` / ``head_dim`` shape the projections and group channels for ``probs``;
    phi normalises over all H*D channels of a token, as in the paper. ``rescale``: multiply the shared sum by
    ``train_tokens / n`` (default: the tokens the model was built for), so its size does not grow with the
    input's token count; the factor is 1 at the training size, so training and the weights are unchanged. A
    key-padding ``attn_mask`` leaves the padded keys out of the sum (and out of n).
    """

    no_rope = (
        "its per-channel product never pairs channels in a dot product, so a rotation cannot make it depend on "
        "offsets; use attention='linear' with rope"
    )
    has_logits = False
    no_causal = "it has no causal form here; use attention='linear' with causal: true"
    no_sr: Optional[str] = None

    def __init__(
        self, dim: int, num_heads: int = 8, *args, rescale: bool = False, train_tokens: Optional[int] = None, **kwargs
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        if not isinstance(rescale, bool):
            raise ValueError(f"hydra rescale={rescale!r}; give true or false")
        self.rescale, self.train_tokens = rescale, train_tokens or self.num_tokens
        if rescale and not self.train_tokens:
            raise ValueError(
                "hydra rescale=true needs the training token count: build it inside a vitzoo model "
                "or set train_tokens=<tokens at training resolution>"
            )

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        keys = AF.key_padding(attn_mask)
        sum_scale = self.train_tokens / AF.key_count(keys, k) if self.rescale else 1.0
        return hydra_attention(q, k, v, logit_noise, sum_scale, keys)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        return hydra_probs(q[:, :, query_index], k, AF.key_padding(attn_mask))
