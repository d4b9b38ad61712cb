"""Focused linear attention (FLatten, Han et al. ICCV 2023): a sharpening feature map plus a depthwise
convolution on V that restores the rank linear attention loses. The mathematics: docs/mechanisms.md
section 10.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .feature_maps import FeatureMap, register_feature_map
from .grid import GridBoundAttention, GridModule, Layout, resample_tokens
from .grid_conv import grid_conv
from .linear import LinearAttention
from .performer import refuse_feature_map
from .registry import register_attention

__all__ = ["focus", "FOCUS_NORMS", "FocusedFeatureMap", "KeyPositionEncoding", "FocusedLinearAttention"]

FOCUS_NORMS = {"token": (1, 3), "head": (3,)}  # the dims of (B, H, N, D) each focusing norm runs over
RELU_SHIFT = 1e-6  # FLatten adds it after the ReLU: every feature channel is positive


def focus(x: torch.Tensor, power: float, dims=(-1,)) -> torch.Tensor:
    """f_p(x) = |x| x^p / |x^p| (element-wise power, both norms over ``dims``)."""
    xp = x**power
    norm = torch.linalg.vector_norm(x, dim=dims, keepdim=True)
    return xp * (norm / torch.linalg.vector_norm(xp, dim=dims, keepdim=True).clamp_min(torch.finfo(xp.dtype).tiny))


@register_feature_map("focused")
class FocusedFeatureMap(FeatureMap):
    """phi_p(x) = f_p((relu(x) + 1e-6) / softplus(s)), ``power`` p, s a learnable scale per channel (starts at 0).

    ``norm``: ``token`` takes f_p's norms over all H*D channels of a token (FLatten), ``head`` over each head's
    D channels (vitzoo's variant).
    """

    def __init__(self, head_dim: int, num_heads: int = 1, *, power: float = 3.0, norm: str = "token"):
        super().__init__(head_dim, num_heads)
        if not power > 0:
            raise ValueError(f"power must be > 0 (1 = plain relu features, FLatten uses 3), got {power}")
        if norm not in FOCUS_NORMS:
            raise ValueError(f"unknown focus_norm={norm!r}; choose one of {list(FOCUS_NORMS)} (token: FLatten's)")
        self.power, self.norm = power, norm
        self.scale = nn.Parameter(torch.zeros(num_heads, 1, head_dim))

    def forward(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        r = (F.relu(AF.acc(x)) + RELU_SHIFT) / F.softplus(AF.acc(self.scale))
        return focus(r, self.power, FOCUS_NORMS[self.norm])

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, power={self.power}, norm={self.norm}"


class KeyPositionEncoding(GridModule):
    """P (tokens, H*D): a learned row per token of the built layout (prefix tokens their own), added to the keys.

    Starts at 0. At another layout the grid rows are resampled bilinearly over the patch grid, prefix rows kept.
    """

    def __init__(self, channels: int, layout: Layout, device=None, dtype=None):
        super().__init__(layout, device)
        self.weight = nn.Parameter(torch.zeros(layout.tokens, channels, device=device, dtype=dtype))

    def forward(self, layout: Layout) -> torch.Tensor:
        """P at ``layout``: (tokens of layout, H*D)."""
        return resample_tokens(self.weight, 0, self.built, layout)

    def resample_state(self, state, prefix, src):
        self._resample_entry(state, prefix + "weight", src, (0,))


@register_attention("focused_linear")
class FocusedLinearAttention(LinearAttention, GridBoundAttention):
    """FLatten: o_i = phi(q_i) mean_j phi(k_j)^T v_j / (phi(q_i).mean_j phi(k_j) + eps) + DWC(V)_i.

    ``pos_embed``: add a learned position encoding to k first (FLatten's; resampled at another layout,
    ``interpolate``). ``focus_norm``: ``token`` (FLatten) or ``head`` (see ``FocusedFeatureMap``). DWC is a
    ``kernel_size`` depthwise conv over the patch grid (0: none); prefix (class / register) tokens are not on
    the grid: the conv sees only grid tokens (zero padding at the border) and prefix outputs get no conv term.
    Logit noise is linear attention's exp(eps_j) per key.
    """

    no_causal = "its conv sees both sides; drop causal, or use attention='linear' with causal: true"
    resampled = "key position encoding"
    no_sr = "its key position table and DWC(V) sit on the query grid (FLatten's PVT reduces only its softmax stages)"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        power: float = 3.0,
        kernel_size: int = 5,
        focus_norm: str = "token",
        pos_embed: bool = True,
        eps: float = 1e-6,
        **kwargs,
    ):
        refuse_feature_map("focused_linear", kwargs)
        super().__init__(
            dim,
            num_heads,
            *args,
            feature_map={"name": "focused", "power": power, "norm": focus_norm},
            eps=eps,
            **kwargs,
        )
        if self.causal:
            raise ValueError(f"focused_linear has no causal form: {self.no_causal}")
        if not isinstance(pos_embed, bool):
            raise ValueError(f"focused_linear pos_embed={pos_embed!r}; give true or false")
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.pos = KeyPositionEncoding(self.attn_dim, self.built_layout, **dd) if pos_embed else None
        self.dwc = grid_conv("focused_linear", self.attn_dim, kernel_size, **kwargs)

    def features(self, q, k, key_mask=None):
        """phi(q) and phi(k + P) / n: the sums over keys become FLatten's means (its eps is on the mean; n counts the
        keys of ``key_mask``)."""
        if self.pos is not None:
            H, D = k.shape[1], k.shape[3]  # P: (n, H*D), or (B, n, H*D) with a table per image
            pos = self.layout_table(self.pos, k.shape[-2], 0).to(k.dtype)
            last = pos.dim() - 1  # non-negative axes: the TorchScript ONNX exporter copies negative ones into perm
            k = k + pos.unflatten(last, (H, D)).transpose(last - 1, last)
        return self.phi(q, is_query=True), self.phi(k, is_query=False) / AF.key_count(key_mask, k), "identity"

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        """The attention term's rows as distributions over keys: the share eps takes (mixing nothing) left out."""
        if self.rope is not None:
            return super().probs(x, q, k, attn_mask, is_causal, query_index)
        keys = AF.key_padding(attn_mask)
        fq, fk, name = self.features(q, k, keys)
        return AF.kernel_probs(fq[:, :, query_index], fk, name, eps=0.0, key_mask=keys)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        out = super().mix(x, q, k, v, attn_mask, is_causal, logit_noise)
        if self.dwc is None:
            return out
        grid = self.current_grid(v.shape[-2])
        return out + self.dwc.over_grid(v, grid, self.num_prefix_tokens, AF.key_padding(attn_mask))
