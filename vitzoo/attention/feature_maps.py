"""Feature maps for kernel (linear) attention, sim(q, k) = phi(q) . phi(k), as registered modules.

Two layers:

- ``FUSED_MAPS``: the parameter-free maps the fused kernels apply themselves, by name
  (``elu``, ``relu``, ``taylor``, and ``identity`` for features computed beforehand), re-exported
  from their one table in ``vitzoo.kernels.feature_maps`` (values and derivatives). Each takes
  (..., D) and returns (..., D'); only ``taylor`` changes the width (it prepends a constant 1 so
  that phi(q) . phi(k) = 1 + cos(q, k), docs/mechanisms.md).
- ``FeatureMap`` modules built from a spec: a name (``"elu"``) or a mapping with options
  (``{"name": "performer", "num_features": 256}``). A module may hold parameters or buffers.
  One whose ``fused_map`` names an entry of ``FUSED_MAPS`` runs fully fused; any other computes
  its features here and the kernels take them as they are (``identity``), still in O(n).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from vitzoo.kernels.feature_maps import FUSED_MAPS, feature_map

from .registry import Registry, Spec

__all__ = [
    "FUSED_MAPS",
    "feature_map",
    "FeatureMap",
    "FeatureMapSpec",
    "register_feature_map",
    "list_feature_maps",
    "build_feature_map",
]

FeatureMapSpec = Spec


class FeatureMap(nn.Module):
    """phi: (B, H, N, head_dim) -> (B, H, N, feature_dim), fp32 or wider, non-negative.

    ``fused_map`` names the entry of ``FUSED_MAPS`` this module is (the kernels then apply it
    themselves); a module with ``fused_map = None`` computes features in ``forward``. ``is_query``
    lets a map treat queries and keys differently (Performer's stabilisers).
    """

    fused_map: Optional[str] = None
    # how linear attention with this map takes ``rope`` (ZooAttention.rope_form): ``decoupled`` (turned features in
    # the numerator only) unless phi(q) . phi(k) is a function of q . k that stays >= 0 when q and k turn (``rotate``)
    rope_form = "decoupled"

    def __init__(self, head_dim: int, num_heads: int = 1):
        super().__init__()
        self.head_dim, self.num_heads = head_dim, num_heads

    @property
    def feature_dim(self) -> int:
        return self.head_dim

    def forward(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        # fused_map None: feature_map raises its ValueError (a subclass without a fused map overrides forward)
        fused = feature_map(self.fused_map)  # type: ignore[arg-type]
        return fused(x.to(torch.promote_types(x.dtype, torch.float32)))

    def extra_repr(self) -> str:
        return f"fused_map={self.fused_map}, head_dim={self.head_dim}, feature_dim={self.feature_dim}"


_FEATURE_MAPS = Registry("feature_map", FeatureMap)
register_feature_map = _FEATURE_MAPS.register
list_feature_maps = _FEATURE_MAPS.names


def build_feature_map(spec: FeatureMapSpec, head_dim: int, num_heads: int = 1) -> FeatureMap:
    """The module for ``spec`` (a name or ``{"name": ..., options}``, parsed by ``Registry.resolve``)."""
    cls, options = _FEATURE_MAPS.resolve(spec)
    return cls(head_dim, num_heads, **options)


@register_feature_map("elu")
class EluFeatureMap(FeatureMap):
    """elu(x) + 1."""

    fused_map = "elu"


@register_feature_map("relu")
class ReluFeatureMap(FeatureMap):
    """relu(x)."""

    fused_map = "relu"


@register_feature_map("taylor")
class TaylorFeatureMap(FeatureMap):
    """[1, x / |x|]: phi(q) . phi(k) = 1 + cos(q, k)."""

    fused_map = "taylor"
    rope_form = "rotate"  # 1 + cos(R_i q, R_j k) depends on the offset and stays >= 0

    @property
    def feature_dim(self) -> int:
        return self.head_dim + 1
