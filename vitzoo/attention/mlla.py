"""MLLA's linear attention (Han et al., NeurIPS 2024, "Demystify Mamba in Vision"): elu+1 features, decoupled RoPE
across all channels before the head split, and LePE (a 3x3 depthwise conv of V). Its Mamba-like block is the ViT's
``block="mlla"`` (vitzoo.models.blocks). The mathematics: docs/mechanisms.md section 16.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from . import functional as AF
from .base import HeadProjection
from .decoupled import DecoupledRopeAttention, mlla_angles, positive_features
from .registry import register_attention

__all__ = ["MllaAttention"]


@register_attention("mlla")
class MllaAttention(DecoupledRopeAttention):
    """o_i = (R_i phi(q_i))^T sum_j (R_j phi(k_j)) v_j^T / (phi(q_i) . sum_j phi(k_j) + n eps) + LePE(v)_i.

    phi = elu + 1. R is MLLA's RoPE over all H*d channels of the grid position (pairs of adjacent channels; the
    first half of the pairs turn with the row, the second with the column, so each head turns along one axis),
    recomputed for each input's grid with integer positions; prefix tokens are not rotated. A ``rope`` option
    replaces this table by its own (per head, docs/mechanisms.md section 20). LePE is a
    ``kernel_size`` depthwise conv of V. Logit noise is the per-key factor exp(eps_j) on phi(k_j) in numerator and
    normaliser. ``bare``: the layer as MLLA's block holds it (``LinearAttention``): q and k from one Linear C -> 2C,
    v the input itself, no output projection (the block's in_proj and out_proj do those jobs); it loads MLLA's own
    names (``qk``; its stored ``rope.rotations`` table is recomputed, so it is dropped).
    """

    no_causal = "its LePE conv sees both sides; use attention='linear' with causal: true"

    def __init__(self, dim: int, num_heads: int = 8, *args, bare: bool = False, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        if not isinstance(bare, bool):
            raise ValueError(f"mlla bare={bare!r}; give true (MLLA's own layer in its block) or false")
        self.bare = bare
        if self.bare:
            if self.heads != "split" or self.attn_dim != dim or self.out_gate is not None:
                raise ValueError(
                    f"mlla bare=True takes v as the input itself: it needs heads=split, num_heads * head_dim = dim "
                    f"({self.attn_dim} vs {dim}) and no gate (set bare=False for those)"
                )
            dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
            bias = self.in_proj.proj.bias is not None
            self.projections = ("q", "k")
            self.in_proj = HeadProjection(dim, num_heads, self.head_dim, 2, "split", bias, **dd)
            self.proj = nn.Identity()  # type: ignore[assignment]  # no output projection
            self.register_load_state_dict_pre_hook(MllaAttention._official_names)
        if self.head_dim % 2 or self.attn_dim % 4:
            raise ValueError(
                f"mlla's RoPE turns channel pairs, half by row and half by column: "
                f"head_dim={self.head_dim} must be even and num_heads * head_dim={self.attn_dim} a "
                "multiple of 4 (set head_dim)"
            )

    def _official_names(self, state_dict: dict, prefix: str, *args) -> None:
        """MLLA's ``qk`` Linear is ``in_proj.proj``; its RoPE table (``rope.rotations``) is recomputed per grid."""
        for kind in ("weight", "bias"):
            if f"{prefix}qk.{kind}" in state_dict:
                state_dict[f"{prefix}in_proj.proj.{kind}"] = state_dict.pop(f"{prefix}qk.{kind}")
        state_dict.pop(f"{prefix}rope.rotations", None)

    def project(self, x: torch.Tensor):
        q, k, v = super().project(x)
        if v is None:  # bare: v is the input, cut into heads
            v = x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)
        return q, k, v

    def features(self, q, k, logit_noise: float = 0.0, key_mask=None):
        fq, fk = positive_features(q, k)  # per token: nothing here reads the other tokens
        noise = AF.key_noise(k, logit_noise)
        if noise is not None:
            fk = fk * noise.exp()
        return fq, fk, self.angles(fq)

    def own_angles(self, grid, like):
        return mlla_angles(grid, self.num_prefix_tokens, self.num_heads, self.head_dim, like)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", bare={self.bare}"
