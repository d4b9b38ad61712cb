"""PolaFormer (Meng et al., ICLR 2025): polarity-aware linear attention. Same-sign and opposite-sign interactions of
q and k mix the two halves of each head's values; a learnable power sharpens the features, a depthwise conv shared
by the heads restores rank, a linear gate multiplies the result. The mathematics: docs/mechanisms.md section 14.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .decoupled import decoupled_linear
from .gated import LinearGatedAttention
from .grid import GridBoundAttention, GridModule, Layout, resample_tokens
from .grid_conv import grid_conv
from .registry import register_attention
from .rope import rotate_all

__all__ = ["KeyPositions", "PolaAttention", "polarity_features", "pola_attention", "pola_probs", "both_halves"]


class KeyPositions(GridModule):
    """P: one learnable d-vector per head and built token (H, n, d), added to the keys; starts at 0. At another
    layout the grid rows are resampled bilinearly and the prefix rows kept."""

    def __init__(self, num_heads: int, head_dim: int, layout: Layout, device=None, dtype=None):
        super().__init__(layout, device)
        self.weight = nn.Parameter(torch.zeros(num_heads, layout.tokens, head_dim, device=device, dtype=dtype))

    def forward(self, layout: Layout) -> torch.Tensor:
        return resample_tokens(self.weight, 1, self.built, layout)

    def resample_state(self, state, prefix, src):
        self._resample_entry(state, prefix + "weight", src, dims=(1,))


def polarity_features(
    q: torch.Tensor, k: torch.Tensor, power: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(phi_S(q), phi_O(q), phi(k)): with x+ = relu(x)^p, x- = relu(-x)^p, phi_S(q) = [q+, q-], phi_O(q) = [q-, q+],
    phi(k) = [k+, k-] (2d features, fp32 or wider); ``power`` p broadcasts over the head's channels."""
    q, k = AF.acc(q), AF.acc(k)
    qp, qn = F.relu(q) ** power, F.relu(-q) ** power
    kp, kn = F.relu(k) ** power, F.relu(-k) ** power
    return torch.cat([qp, qn], -1), torch.cat([qn, qp], -1), torch.cat([kp, kn], -1)


def both_halves(angles: torch.Tensor) -> torch.Tensor:
    """A RoPE table of d/2 angles per token (..., n, d/2) for the 2d polarity features: the same angles turn the
    positive half [x+] and the negative half [x-], so each stream's similarity is a sum of turned dot products."""
    return torch.cat([angles, angles], dim=-1)


def pola_attention(
    fs: torch.Tensor,
    fo: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    eps: float = 1e-6,
    impl: str = "auto",
    key_mask: Optional[torch.Tensor] = None,
    angles: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """[A^S v1, A^O v2] by the kernel path: v1, v2 are the halves of each head's values, A^S, A^O the row-normalised
    phi_S(q).phi(k) and phi_O(q).phi(k) over the keys of ``key_mask``; ``eps`` relative to the mean over keys (n eps
    on the sums, as eps on the sums of queries divided by n). ``angles`` (a RoPE table, (..., n, d/2)): decoupled
    RoPE, the features turned (``both_halves``) in the numerators only."""
    half, n = v.shape[-1] // 2, AF.key_count(key_mask, fk)
    wide = v.to(fk.dtype)

    def stream(fq: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        if angles is None:
            return AF.linear_attention(fq / n, fk, values, "identity", eps, impl, key_mask=key_mask)
        return decoupled_linear(fq / n, AF.mask_keys(fk, key_mask), both_halves(angles), values, eps, impl, 1)

    return torch.cat([stream(fs, wide[..., :half]), stream(fo, wide[..., half:])], dim=-1).to(v.dtype)


def pola_probs(
    fs: torch.Tensor, fo: torch.Tensor, fk: torch.Tensor, key_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """(A^S + A^O) / 2 with A the row-normalised |similarities|: each key's share of a query's mix, averaged over the
    two halves of the value channels (the output's eps, relative to the mean over keys, is left out: with tiny
    features it leaves the output's rows short of 1, the shares still sum to 1). Turned features (decoupled RoPE)
    give signed similarities, hence the absolute value, as for ``decoupled_probs``."""
    tiny = torch.finfo(fk.dtype).tiny
    keys = AF.mask_keys(fk, key_mask).transpose(-2, -1)
    shares = [s / s.sum(-1, keepdim=True).clamp_min(tiny) for s in ((fs @ keys).abs(), (fo @ keys).abs())]
    return (shares[0] + shares[1]) / 2


@register_attention("pola")
class PolaAttention(LinearGatedAttention, GridBoundAttention):
    """Polarity-aware linear attention: y = proj((O + DWC(V)) * g).

    k gets the key positions P, then q, k are divided by softplus(s) (s per channel, starts at 0) and raised to
    p = 1 + ``alpha`` sigmoid(theta) per head channel (theta starts at 0: p = 1 + alpha/2). The same-sign stream
    mixes the first half of each head's values, the opposite-sign stream the second; the normaliser's ``eps`` is
    relative to the mean over keys. DWC is a ``kernel_size`` depthwise conv of the head's d channels, shared by the
    heads, on grid tokens only (prefix rows get none). P's grid rows are resampled at another token layout
    (``interpolate``). Logit noise is the per-key factor exp(eps_j) on phi(k_j), shared by both streams. A key-padding
    ``attn_mask`` leaves the padded keys out of both streams and shows them to the conv as 0. ``rope`` takes the
    decoupled form: the polarity features turned (each half by the table) in the numerators, plain in the normalisers.
    """

    rope_form = "decoupled"
    has_logits = False
    no_causal = "its conv and key positions see both sides; use attention='linear' with causal: true"
    resampled = "key positions P"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        alpha: float = 4.0,
        kernel_size: int = 5,
        eps: float = 1e-6,
        impl: str = "auto",
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        if self.head_dim % 2:
            raise ValueError(
                f"pola splits each head's values into two halves: head_dim={self.head_dim} must be even "
                "(set num_heads or head_dim)"
            )
        if not alpha > 0:
            raise ValueError(f"pola alpha={alpha} must be > 0 (the power p lies in (1, 1 + alpha); PolaFormer uses 4)")
        if impl not in AF.LINEAR_IMPLS:
            raise ValueError(f"unknown impl={impl!r}; choose one of {list(AF.LINEAR_IMPLS)}")
        dd = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.alpha, self.eps, self.impl = float(alpha), eps, impl
        self.scale = nn.Parameter(torch.zeros(num_heads, 1, self.head_dim, **dd))
        self.power = nn.Parameter(torch.zeros(num_heads, 1, self.head_dim, **dd))
        self.key_positions = KeyPositions(num_heads, self.head_dim, self.built_layout, **dd)
        self.dwc = grid_conv("pola", self.head_dim, kernel_size, **dd)

    def features(self, q, k):
        """(phi_S(q), phi_O(q), phi(k)) after the key positions and the scale."""
        k = k + self.layout_table(self.key_positions, k.shape[-2], 1)  # (H, n, d), or (B, H, n, d) per image
        scale = F.softplus(AF.acc(self.scale))
        power = 1 + self.alpha * torch.sigmoid(AF.acc(self.power))
        return polarity_features(AF.acc(q) / scale, AF.acc(k) / scale, power)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        fs, fo, fk = self.features(q, k)
        noise = AF.key_noise(k, logit_noise)
        if noise is not None:
            fk = fk * noise.exp()
        keys = AF.key_padding(attn_mask)
        angles = None if self.rope is None else self.rope_angles(v.shape[-2], fs)
        out = pola_attention(fs, fo, fk, v, self.eps, self.impl, keys, angles)
        if self.dwc is None:
            return out
        B, H, N, D = v.shape
        v = AF.mask_keys(v, keys).reshape(B * H, 1, N, D)
        return out + self.dwc.over_grid(v, self.current_grid(N), self.num_prefix_tokens).reshape(B, H, N, D)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        fs, fo, fk = self.features(q, k)
        if self.rope is not None:
            fs, fo, fk = rotate_all(both_halves(self.rope_angles(k.shape[-2], fs)), fs, fo, fk)
        return pola_probs(fs[:, :, query_index], fo[:, :, query_index], fk, AF.key_padding(attn_mask))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", alpha={self.alpha}, impl={self.impl}"
