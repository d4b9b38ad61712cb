"""Performer (FAVOR+, Choromanski et al. 2021): softmax attention estimated with positive orthogonal
random features, in O(n m d). The mathematics: docs/mechanisms.md section 7.

The feature map is a registered spec (``{name: performer, num_features: 256}``), so ``linear`` can use
it too; the ``performer`` mechanism is linear attention with that map plus the softmax's ``scale``.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch

from .feature_maps import FeatureMap, register_feature_map
from .functional import acc, check_scale, key_count, logit_scale, mask_keys
from .linear import LinearAttention
from .registry import register_attention

__all__ = [
    "orthogonal_gaussian",
    "performer_features",
    "PerformerFeatureMap",
    "PerformerAttention",
    "refuse_feature_map",
]


def orthogonal_gaussian(num_features: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """W (m, d): rows orthogonal within each block of d, each row as long as a d-dim Gaussian vector."""
    blocks = []
    for _ in range(-(-num_features // dim)):
        q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator, dtype=torch.float64))
        blocks.append((q * r.diagonal().sign()).T)  # the sign fix makes Q uniform (Haar), not LAPACK-biased
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return (torch.cat(blocks)[:num_features] * norms).float()


def performer_features(
    x: torch.Tensor,
    weight: torch.Tensor,
    is_query: bool,
    scale: Union[float, torch.Tensor, None] = None,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """phi(x) = exp(W x' - |x'|^2 / 2 - c) / sqrt(m), x' = x sqrt(scale) (scale 1/sqrt(d): x / d^(1/4)).

    The stabiliser c is the exponent's max over each query row (q) or one constant over all keys and
    features of a head (k); both cancel in the attention's ratio, so no gradient flows through them
    (detached: a quarter of the backward's time went into the max's gradient). 1 / sqrt(m) joins c in the
    exponent, saving a pass over the n x m features. The keys' c is taken over the keys whose ``key_mask`` is True,
    the others' features are 0.
    """
    x = acc(x) * (x.shape[-1] ** -0.5 if scale is None else scale) ** 0.5
    u = x @ weight.to(x.dtype).T - x.square().sum(dim=-1, keepdim=True) / 2
    if is_query:
        c = u.detach().amax(dim=-1, keepdim=True)
    elif key_mask is None:
        c = u.detach().amax(dim=(-2, -1), keepdim=True)
    else:  # padded keys' exponents -inf (features 0); an image with no key: c = 0, all its features 0
        u = mask_keys(u, key_mask, float("-inf"))
        c = u.detach().amax(dim=(-2, -1), keepdim=True)
        c = c.masked_fill(c == float("-inf"), 0.0)
    return (u - (c + 0.5 * math.log(weight.shape[0]))).exp()


@register_feature_map("performer")
class PerformerFeatureMap(FeatureMap):
    """FAVOR+ features of ``num_features`` random directions W, shared by the heads.

    W is a buffer (saved with the model). In training it is redrawn every ``redraw_interval`` forward
    passes (0 = never) from a generator seeded by the buffers ``seed`` and ``step``, so redraws are
    reproducible and the same on every process; eval never redraws.
    """

    rope_form = "rotate"  # an unbiased estimate of softmax(R_i q . R_j k): RoPE on softmax
    seed: torch.Tensor  # buffers, registered in __init__
    step: torch.Tensor
    weight: torch.Tensor

    def __init__(self, head_dim: int, num_heads: int = 1, *, num_features: int = 256, redraw_interval: int = 1000):
        super().__init__(head_dim, num_heads)
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}; the paper's default is 256")
        if redraw_interval < 0:
            raise ValueError(
                f"redraw_interval counts training steps and must be >= 0 (0 = never), got {redraw_interval}"
            )
        self.num_features, self.redraw_interval = num_features, redraw_interval
        self.register_buffer("seed", torch.randint(2**62, ()))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self.register_buffer("weight", self.draw())

    @property
    def feature_dim(self) -> int:
        return self.num_features

    def draw(self) -> torch.Tensor:
        """W for the current ``step`` (a function of ``seed`` and ``step`` only)."""
        generator = torch.Generator().manual_seed(int(self.seed) + int(self.step))
        return orthogonal_gaussian(self.num_features, self.head_dim, generator).to(self.seed.device)

    def forward(
        self,
        x: torch.Tensor,
        is_query: bool,
        scale: Union[float, torch.Tensor, None] = None,
        key_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        if is_query and self.training and self.redraw_interval:  # one step per (q, k) pair
            if self.step > 0 and self.step % self.redraw_interval == 0:
                self.weight = self.draw().to(self.weight.dtype)
            self.step += 1
        return performer_features(x, self.weight, is_query, scale, key_mask)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_features={self.num_features}, redraw_interval={self.redraw_interval}"


def refuse_feature_map(name: str, options: dict) -> None:
    """Mechanisms that fix their own feature map refuse a ``feature_map`` option in one line."""
    if "feature_map" in options:
        raise ValueError(
            f"attention {name!r} sets its own feature map; drop feature_map, or use attention "
            f"'linear' with feature_map: {{name: {name}, ...}}"
        )


@register_attention("performer")
class PerformerAttention(LinearAttention):
    """Linear attention with FAVOR+ features: an unbiased estimate of softmax(q k^T * scale) v.

    ``scale``: ``sqrt_d`` or the log-n scale of softmax (``train_tokens`` as there), applied as
    x' = x sqrt(scale). Logit noise is the per-key factor exp(eps_j) of linear attention.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        num_features: int = 256,
        redraw_interval: int = 1000,
        scale: str = "sqrt_d",
        train_tokens: Optional[int] = None,
        **kwargs,
    ):
        refuse_feature_map("performer", kwargs)
        fmap = {"name": "performer", "num_features": num_features, "redraw_interval": redraw_interval}
        super().__init__(dim, num_heads, *args, feature_map=fmap, **kwargs)
        self.scale_mode, self.train_tokens = scale, train_tokens or self.num_tokens
        check_scale(scale, self.train_tokens)

    def features(self, q, k, key_mask=None):
        s = logit_scale(self.scale_mode, self.head_dim, key_count(key_mask, k), self.train_tokens)
        return self.phi(q, True, s), self.phi(k, False, s, key_mask), "identity"

    def extra_repr(self) -> str:
        return super().extra_repr() + f", scale={self.scale_mode}"
