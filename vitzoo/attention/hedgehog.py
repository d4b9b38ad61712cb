"""Hedgehog (Zhang et al., ICLR 2024): a learnable feature map trained to mimic softmax attention.

phi(x) = softmax([x W + b, -(x W + b)]) per head, W (head_dim x m), b (m): 2m non-negative features
summing to 1. A registered spec for ``linear`` (``{name: hedgehog, num_features: 32}``); its features
run on the fused O(n) path as precomputed features. The mathematics: docs/mechanisms.md section 3.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .feature_maps import FeatureMap, register_feature_map
from .functional import acc

__all__ = ["hedgehog_features", "HedgehogFeatureMap"]


def hedgehog_features(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """softmax([u, -u]) over the features, u = x W + b: x (B, H, N, d), W (H, d, m), b (H, 1, m) -> (B, H, N, 2m)."""
    x = acc(x)
    u = x @ weight.to(x.dtype) + bias.to(x.dtype)
    return torch.cat([u, -u], dim=-1).softmax(dim=-1)


@register_feature_map("hedgehog")
class HedgehogFeatureMap(FeatureMap):
    """Hedgehog's map with ``num_features`` m per head, shared by queries and keys.

    W starts as the identity when m == head_dim (the paper's initialisation), otherwise as a random
    semi-orthogonal matrix per head (orthonormal rows if m > head_dim, orthonormal columns if m <
    head_dim), which keeps |x W| = |x| or projects x onto m orthonormal directions; b starts at 0.
    """

    def __init__(self, head_dim: int, num_heads: int = 1, *, num_features: int = 32):
        super().__init__(head_dim, num_heads)
        if not isinstance(num_features, int) or isinstance(num_features, bool) or num_features < 1:
            raise ValueError(
                f"num_features must be an integer >= 1, got {num_features!r}; "
                "Hedgehog uses the head dim (identity initialisation)"
            )
        self.num_features = num_features
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, num_features))
        self.bias = nn.Parameter(torch.zeros(num_heads, 1, num_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W = I (m == head_dim) or semi-orthogonal per head; b = 0."""
        with torch.no_grad():
            if self.num_features == self.head_dim:
                self.weight.copy_(torch.eye(self.head_dim).expand_as(self.weight))
            else:
                for w in self.weight:
                    nn.init.orthogonal_(w)
            self.bias.zero_()

    @property
    def feature_dim(self) -> int:
        return 2 * self.num_features

    def forward(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        return hedgehog_features(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_features={self.num_features}"
