"""LION (Afzal et al. 2025): bidirectional linear attention with a decay mask, A_ij = phi(q_i).phi(k_j) M_ij,
o_i = sum_j A_ij v_j / (sum_j A_ij + eps / tau). ``decay``: ``none`` (LION-Lit, M = 1, elu+1 features),
``fixed`` (LION-D, M_ij = lambda_h^|i-j|) or ``selective`` (LION-S, M_ij = the product of the gates lambda_s over
s between i and j, the key's own included, the query's not). Tokens are in the backbone's order: prefix (class)
tokens first, then the grid in raster order. The mathematics: docs/mechanisms.md section 18.

The masked forms run chunk by chunk in O(n (c + d) d): a forward and a backward scan over chunks of ``chunk``
tokens carry the decayed state sum_j M_ij phi(k_j) [v_j, 1]^T, the c x c blocks on the diagonal are formed
explicitly, and the diagonal counted by both scans is removed once. ``lion_masked`` is the quadratic form that
defines it.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .base import ZooAttention
from .registry import register_attention

__all__ = ["LionAttention", "DECAYS", "lion_features", "decay_mask", "lion_masked", "lion_chunked"]

DECAYS = ("none", "fixed", "selective")


def lion_features(x: torch.Tensor, decay: str) -> torch.Tensor:
    """elu(x) + 1 (``none``), else (silu(x) + 0.5) / |silu(x) + 0.5| over the head's channels; fp32 or wider."""
    x = AF.acc(x)
    if decay == "none":
        return F.elu(x) + 1.0
    return F.normalize(F.silu(x) + 0.5, dim=-1)


def _cumulative(log_gates: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(L, R): L_i = sum_{s<i} log lambda_s, R_i = sum_{s<=i} log lambda_s."""
    inclusive = log_gates.cumsum(dim=-1)
    return inclusive - log_gates, inclusive


def decay_mask(log_gates: torch.Tensor, query_index: torch.Tensor) -> torch.Tensor:
    """M for the queries ``query_index`` from per-token log-gates (B, H, n): M_ij = exp(L_i - L_j) for j <= i,
    exp(R_j - R_i) for j >= i (B, H, Q, n)."""
    lower, upper = _cumulative(log_gates)
    i = query_index[:, None]
    j = torch.arange(log_gates.shape[-1], device=log_gates.device)[None, :]
    before = lower[..., query_index, None] - lower[..., None, :]
    after = upper[..., None, :] - upper[..., query_index, None]
    return torch.where(j <= i, before, after).exp()


def lion_masked(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, log_gates: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """The quadratic form: A = (fq fk^T) * M, o = A v / (A 1 + eps / tau), tau = d^-1/2; O(n^2 d)."""
    mask = decay_mask(log_gates, torch.arange(fq.shape[-2], device=fq.device))
    attn = (fq @ fk.transpose(-2, -1)) * mask
    return ((attn @ v.to(attn.dtype)) / (attn.sum(-1, keepdim=True) + eps * fq.shape[-1] ** 0.5)).to(v.dtype)


def _forward_scan(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, log_gates: torch.Tensor, chunk: int
) -> torch.Tensor:
    """sum_{j<=i} exp(L_i - L_j) (fq_i.fk_j) v_j for every i, chunk by chunk; v carries a ones column."""
    B, H, N, _ = fq.shape
    pad = -N % chunk
    if pad:
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
        log_gates = F.pad(log_gates, (0, pad))
    T = (N + pad) // chunk
    fq, fk, v = (t.unflatten(2, (T, chunk)) for t in (fq, fk, v))
    lower = _cumulative(log_gates)[0].unflatten(-1, (T, chunk))  # L_i
    start = lower[..., :1]  # L at each chunk's first token
    end = lower[..., -1:] + log_gates.unflatten(-1, (T, chunk))[..., -1:]  # L at the next chunk's first token
    inside = (lower[..., :, None] - lower[..., None, :]).masked_fill(
        ~torch.ones(chunk, chunk, dtype=torch.bool, device=fq.device).tril(), float("-inf")
    )
    out = ((fq @ fk.transpose(-2, -1)) * inside.exp()) @ v
    reads = fq * (lower - start).exp().unsqueeze(-1)  # fq_i exp(L_i - L_start)
    writes = (fk * (end - lower).exp().unsqueeze(-1)).transpose(-2, -1) @ v  # each chunk's own state at its end
    carry = (end - start).exp().unsqueeze(-1)  # decay across a whole chunk
    state, inter = writes[:, :, 0], []  # the first chunk has nothing before it
    for t in range(1, T):
        inter.append(reads[:, :, t] @ state)
        state = carry[:, :, t] * state + writes[:, :, t]
    if inter:
        out = torch.cat([out[:, :, :1], out[:, :, 1:] + torch.stack(inter, dim=2)], dim=2)
    return out.flatten(2, 3)[:, :, :N]


def lion_chunked(
    fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, log_gates: torch.Tensor, eps: float = 1e-6, chunk: int = 64
) -> torch.Tensor:
    """``lion_masked``'s output in O(n (c + d) d): a forward and a backward chunked scan, the diagonal once."""
    wide = torch.cat([v.to(fq.dtype), torch.ones_like(v[..., :1], dtype=fq.dtype)], dim=-1)
    forward = _forward_scan(fq, fk, wide, log_gates, chunk)
    backward = _forward_scan(fq.flip(2), fk.flip(2), wide.flip(2), log_gates.flip(-1), chunk).flip(2)
    both = forward + backward - (fq * fk).sum(-1, keepdim=True) * wide
    return (both[..., :-1] / (both[..., -1:] + eps * fq.shape[-1] ** 0.5)).to(v.dtype)


@register_attention("lion")
class LionAttention(ZooAttention):
    """LION's bidirectional attention; ``decay`` none | fixed | selective (LION-Lit, -D, -S).

    ``fixed``: lambda_h = sigmoid(a_h), a_h one trainable scalar per head drawn from N(0, 1). ``selective``:
    lambda_t = 1 - sigmoid(w_h . x_t + b_h) from a Linear C -> H on the layer's input (trunc-normal std 0.02,
    bias 0; trainable), computed in fp32; prefix tokens' gates are 1. ``none`` runs the fused kernel path (``impl``),
    the masks the chunked scans (``chunk`` tokens per chunk). Nothing is tied to the token count: a new grid
    changes the raster distances (vertical neighbours are w apart). Logit noise is the factor exp(eps_j) on
    phi(k_j).
    """

    has_logits = False
    no_mask = "its decay mask is the only mask it takes; use attention='softmax' for masked inputs"
    no_causal = "it is bidirectional; use attention='linear' with causal: true"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        decay: str = "fixed",
        chunk: int = 64,
        eps: float = 1e-6,
        impl: str = "auto",
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        if decay not in DECAYS:
            raise ValueError(f"unknown lion decay={decay!r}; choose one of {list(DECAYS)}")
        if int(chunk) != chunk or chunk < 1:
            raise ValueError(f"lion chunk={chunk!r} must be a positive number of tokens")
        if impl not in AF.LINEAR_IMPLS:
            raise ValueError(f"unknown impl={impl!r}; choose one of {list(AF.LINEAR_IMPLS)}")
        dd: Dict[str, Any] = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.decay, self.chunk, self.eps, self.impl = decay, int(chunk), eps, impl
        self.decay_logit = nn.Parameter(torch.randn(num_heads, **dd)) if decay == "fixed" else None
        self.gate = None
        if decay == "selective":
            self.gate = nn.Linear(dim, num_heads, **dd)
            nn.init.trunc_normal_(self.gate.weight, std=0.02)
            nn.init.zeros_(self.gate.bias)

    def log_gates(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """log lambda per head and token, (B, H, n) (``fixed``: (1, H, n)) in ``like``'s dtype."""
        if self.decay == "fixed":
            assert self.decay_logit is not None  # built for decay='fixed'
            return F.logsigmoid(AF.acc(self.decay_logit)).to(like.dtype)[None, :, None].expand(1, -1, x.shape[1])
        assert self.gate is not None  # built for decay='selective' (decay='none' has no gates)
        logits = F.linear(AF.acc(x), AF.acc(self.gate.weight), AF.acc(self.gate.bias)).transpose(1, 2)
        gates = F.logsigmoid(-logits).to(like.dtype)  # log(1 - sigmoid(z))
        prefix = torch.arange(x.shape[1], device=x.device) < self.num_prefix_tokens
        return gates.masked_fill(prefix, 0.0)

    def features(self, q, k, logit_noise: float = 0.0):
        fq, fk = lion_features(q, self.decay), lion_features(k, self.decay)
        noise = AF.key_noise(k, logit_noise)
        return fq, fk if noise is None else fk * noise.exp()

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        fq, fk = self.features(q, k, logit_noise)
        if self.decay == "none":
            eps = self.eps * self.head_dim**0.5
            return AF.linear_attention(fq, fk, v.to(fq.dtype), "identity", eps, self.impl).to(v.dtype)
        return lion_chunked(fq, fk, v, self.log_gates(x, fq), self.eps, self.chunk)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        fq, fk = self.features(q, k)
        attn = fq[:, :, query_index] @ fk.transpose(-2, -1)
        if self.decay != "none":
            attn = attn * decay_mask(self.log_gates(x, fq), query_index)
        return attn / (attn.sum(-1, keepdim=True) + self.eps * self.head_dim**0.5)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", decay={self.decay}, chunk={self.chunk}"
