"""LION (Afzal et al. 2025): bidirectional linear attention with a decay mask, A_ij = phi(q_i).phi(k_j) M_ij,
o_i = sum_j A_ij v_j / (sum_j A_ij + eps / tau). ``decay``: ``none`` (LION-Lit, M = 1, elu+1 features),
``fixed`` (LION-D, M_ij = lambda_h^|i-j|) or ``selective`` (LION-S, M_ij = the product of the gates lambda_s over
s between i and j, the key's own included, the query's not). ``order``: ``raster`` (the backbone's order: prefix
(class) tokens first, then the grid row by row) or ``snake`` (the paper's LION-D/S with natural symbols: the mean
of two masks, one over a row snake and one over a column snake of the grid, each with its own decay parameters).
The mathematics: docs/mechanisms.md section 18.

The masked forms run chunk by chunk in O(n (c + d) d): a forward and a backward scan over chunks of ``chunk``
tokens carry the decayed state sum_j M_ij phi(k_j) [v_j, 1]^T, the c x c blocks on the diagonal are formed
explicitly, and the diagonal counted by both scans is removed once. ``lion_masked`` is the quadratic form that
defines it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..options import is_count
from . import functional as AF
from .base import ZooAttention
from .decoupled import decoupled_linear
from .registry import register_attention
from .rope import rotate_all

__all__ = [
    "LionAttention",
    "DECAYS",
    "ORDERS",
    "lion_features",
    "decay_mask",
    "lion_masked",
    "lion_chunked",
    "snake_orders",
    "lion_snake",
    "lion_snake_masked",
    "snake_mask",
]

DECAYS = ("none", "fixed", "selective")
ORDERS = ("raster", "snake")


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


def _divided(num: torch.Tensor, den: torch.Tensor, eps: float, fq: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """num / (den + eps / tau), tau = d^-1/2, in v's dtype."""
    return (num / (den + eps * fq.shape[-1] ** 0.5)).to(v.dtype)


def _quadratic(fq, fk, v, mask: torch.Tensor, eps: float, angles: Optional[torch.Tensor]) -> torch.Tensor:
    """A = (fq fk^T) * M, o = A v / (A 1 + eps / tau); with ``angles`` (decoupled RoPE) the numerator's A has the
    turned features (R_i fq_i).(R_j fk_j), the normaliser the plain ones."""
    plain = (fq @ fk.transpose(-2, -1)) * mask
    if angles is None:
        attn = plain
    else:
        rq, rk = rotate_all(angles, fq, fk)
        attn = (rq @ rk.transpose(-2, -1)) * mask
    return _divided(attn @ v.to(attn.dtype), plain.sum(-1, keepdim=True), eps, fq, v)


def lion_masked(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    log_gates: torch.Tensor,
    eps: float = 1e-6,
    angles: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The quadratic form: A = (fq fk^T) * M, o = A v / (A 1 + eps / tau), tau = d^-1/2; O(n^2 d). ``angles``: a
    RoPE table (..., n, d/2) for the decoupled form (``_quadratic``)."""
    mask = decay_mask(log_gates, torch.arange(fq.shape[-2], device=fq.device))
    return _quadratic(fq, fk, v, mask, eps, angles)


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


def _scanned_sums(fq: torch.Tensor, fk: torch.Tensor, wide: torch.Tensor, log_gates: torch.Tensor, chunk: int):
    """sum_j M_ij (fq_i.fk_j) [v_j, 1] (``wide`` carries the ones column): both scans, the diagonal once."""
    forward = _forward_scan(fq, fk, wide, log_gates, chunk)
    backward = _forward_scan(fq.flip(2), fk.flip(2), wide.flip(2), log_gates.flip(-1), chunk).flip(2)
    return forward + backward - (fq * fk).sum(-1, keepdim=True) * wide


def _widened(fq: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.cat([v.to(fq.dtype), torch.ones_like(v[..., :1], dtype=fq.dtype)], dim=-1)


def _scanned(fq, fk, v, angles: Optional[torch.Tensor], sums: Callable) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sum_j M_ij s_ij v_j, sum_j M_ij fq_i.fk_j) by ``sums(fq, fk, values)``: s the plain similarity in one pass
    (v carries a ones column), or with ``angles`` (decoupled RoPE) the turned one, a second pass for the plain
    normaliser."""
    if angles is None:
        both = sums(fq, fk, _widened(fq, v))
        return both[..., :-1], both[..., -1:]
    turned = sums(*rotate_all(angles, fq, fk), v.to(fq.dtype))
    return turned, sums(fq, fk, torch.ones_like(fq[..., :1]))


def lion_chunked(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    log_gates: torch.Tensor,
    eps: float = 1e-6,
    chunk: int = 64,
    angles: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``lion_masked``'s output in O(n (c + d) d): a forward and a backward chunked scan, the diagonal once."""
    num, den = _scanned(fq, fk, v, angles, lambda a, b, w: _scanned_sums(a, b, w, log_gates, chunk))
    return _divided(num, den, eps, fq, v)


def snake_orders(grid: Tuple[int, int], num_prefix: int, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The two sequence orders of LION's natural-symbol variants as token indices (sequence position -> index in
    the backbone's order): prefix tokens first, then the row snake (even rows left to right, odd rows right to
    left) and the column snake (even columns top to bottom, odd columns bottom to top)."""
    h, w = grid
    raster = torch.arange(h * w, device=device).view(h, w)
    rows = torch.where(torch.arange(h, device=device)[:, None] % 2 == 1, raster.flip(1), raster)
    cols = torch.where(torch.arange(w, device=device)[:, None] % 2 == 1, raster.T.flip(1), raster.T)
    prefix = torch.arange(num_prefix, device=device)
    return torch.cat([prefix, rows.flatten() + num_prefix]), torch.cat([prefix, cols.flatten() + num_prefix])


def lion_snake(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    log_gates: Tuple[torch.Tensor, torch.Tensor],
    orders: Tuple[torch.Tensor, torch.Tensor],
    eps: float = 1e-6,
    chunk: int = 64,
    angles: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The natural-symbol form, M = (M^row + M^col) / 2: each order's masked sums by the chunked scans over the
    tokens taken in that order (``log_gates``, in the backbone's order, one tensor per order), put back in the
    backbone's order, averaged, then divided once; O(n (c + d) d)."""

    def sums(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        total = torch.zeros_like(w)
        for gates, order in zip(log_gates, orders):
            ordered = _scanned_sums(a[:, :, order], b[:, :, order], w[:, :, order], gates[..., order], chunk)
            total = total + ordered[:, :, torch.argsort(order)]
        return total / 2

    return _divided(*_scanned(fq, fk, v, angles, sums), eps, fq, v)


def snake_mask(
    log_gates: Tuple[torch.Tensor, torch.Tensor],
    orders: Tuple[torch.Tensor, torch.Tensor],
    query_index: torch.Tensor,
) -> torch.Tensor:
    """(M^row + M^col) / 2 in the backbone's order for the queries ``query_index`` (B, H, Q, n):
    M[p, p'] = M_seq[pos(p), pos(p')] per order, pos the token's place in that order."""
    total = None
    for gates, order in zip(log_gates, orders):
        pos = torch.argsort(order)
        mask = decay_mask(gates[..., order], pos[query_index])[..., pos]
        total = mask if total is None else total + mask
    assert total is not None
    return total / 2


def lion_snake_masked(
    fq: torch.Tensor,
    fk: torch.Tensor,
    v: torch.Tensor,
    log_gates: Tuple[torch.Tensor, torch.Tensor],
    orders: Tuple[torch.Tensor, torch.Tensor],
    eps: float = 1e-6,
    angles: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The quadratic natural-symbol form: A = (fq fk^T) * (M^row + M^col) / 2, o = A v / (A 1 + eps / tau)."""
    mask = snake_mask(log_gates, orders, torch.arange(fq.shape[-2], device=fq.device))
    return _quadratic(fq, fk, v, mask, eps, angles)


def _gate(dim: int, num_heads: int, dd: Dict[str, Any]) -> nn.Linear:
    """LION-S's gate Linear C -> H: trunc-normal std 0.02, bias 0."""
    gate = nn.Linear(dim, num_heads, **dd)
    nn.init.trunc_normal_(gate.weight, std=0.02)
    nn.init.zeros_(gate.bias)
    return gate


@register_attention("lion")
class LionAttention(ZooAttention):
    """LION's bidirectional attention; ``decay`` none | fixed | selective (LION-Lit, -D, -S).

    ``fixed``: lambda_h = sigmoid(a_h), a_h one trainable scalar per head drawn from N(0, 1). ``selective``:
    lambda_t = 1 - sigmoid(w_h . x_t + b_h) from a Linear C -> H on the layer's input (trunc-normal std 0.02,
    bias 0; trainable), computed in fp32; prefix tokens' gates are 1. ``none`` runs the fused kernel path (``impl``),
    the masks the chunked scans (``chunk`` tokens per chunk). ``order``: ``raster`` or ``snake`` (the mean of the
    masks over a row snake and a column snake of the current grid, the prefix tokens first in both; the column
    order has its own ``decay_logit_col`` or ``gate_col``; needs a mask, so not with ``decay='none'``). Nothing
    is tied to the token count: a new grid changes the raster distances (vertical neighbours are w apart) or
    the snakes. Logit noise is the factor exp(eps_j) on phi(k_j). A key-padding ``attn_mask``: ``decay: none`` leaves
    the padded keys out; the decays refuse it (padding changes the token order they run along). ``rope`` takes the
    decoupled form: turned features in the numerator (a second pass of the scans), plain ones in the normaliser.
    """

    rope_form = "decoupled"
    has_logits = False
    no_causal = "it is bidirectional; use attention='linear' with causal: true"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        decay: str = "fixed",
        order: str = "raster",
        chunk: int = 64,
        eps: float = 1e-6,
        impl: str = "auto",
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        if decay not in DECAYS:
            raise ValueError(f"unknown lion decay={decay!r}; choose one of {list(DECAYS)}")
        if order not in ORDERS:
            raise ValueError(f"unknown lion order={order!r}; choose one of {list(ORDERS)}")
        if order == "snake" and decay == "none":
            raise ValueError("lion order='snake' changes only the decay mask; use decay='fixed' or 'selective'")
        if not is_count(chunk):
            raise ValueError(f"lion chunk={chunk!r} must be a positive number of tokens")
        if impl not in AF.LINEAR_IMPLS:
            raise ValueError(f"unknown impl={impl!r}; choose one of {list(AF.LINEAR_IMPLS)}")
        dd: Dict[str, Any] = {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}
        self.decay, self.chunk, self.eps, self.impl = decay, int(chunk), eps, impl
        self.order = order
        self.decay_logit = nn.Parameter(torch.randn(num_heads, **dd)) if decay == "fixed" else None
        self.gate = _gate(dim, num_heads, dd) if decay == "selective" else None
        # the column snake's own parameters (the official a2_h / second gate Linear)
        snake = order == "snake"
        self.decay_logit_col = nn.Parameter(torch.randn(num_heads, **dd)) if snake and decay == "fixed" else None
        self.gate_col = _gate(dim, num_heads, dd) if snake and decay == "selective" else None

    def log_gates(self, x: torch.Tensor, like: torch.Tensor, column: bool = False) -> torch.Tensor:
        """log lambda per head and token, (B, H, n) (``fixed``: (1, H, n)) in ``like``'s dtype, in the backbone's
        token order; ``column``: the column snake's parameters."""
        if self.decay == "fixed":
            logit = self.decay_logit_col if column else self.decay_logit
            assert logit is not None  # built for decay='fixed' (the column one for order='snake')
            return F.logsigmoid(AF.acc(logit)).to(like.dtype)[None, :, None].expand(1, -1, x.shape[1])
        gate = self.gate_col if column else self.gate
        assert gate is not None  # built for decay='selective' (decay='none' has no gates)
        logits = F.linear(AF.acc(x), AF.acc(gate.weight), AF.acc(gate.bias)).transpose(1, 2)
        gates = F.logsigmoid(-logits).to(like.dtype)  # log(1 - sigmoid(z))
        prefix = torch.arange(x.shape[1], device=x.device) < self.num_prefix_tokens
        return gates.masked_fill(prefix, 0.0)

    def features(self, q, k, logit_noise: float = 0.0):
        fq, fk = lion_features(q, self.decay), lion_features(k, self.decay)
        noise = AF.key_noise(k, logit_noise)
        return fq, fk if noise is None else fk * noise.exp()

    def key_padding(self, attn_mask):
        """The key mask of ``attn_mask`` (``decay: none`` only: a decay runs along the whole grid's token order)."""
        if attn_mask is not None and self.decay != "none" and self.image_grids is not None:
            why = f"with decay={self.decay} its decay runs along the canvas's token order, which the padding changes"
            raise ValueError(self.padding_refusal(why, "use decay: none (LION then takes key padding)"))
        if attn_mask is not None and self.decay != "none":
            raise ValueError(
                f"{type(self).__name__} takes no attn_mask: with decay={self.decay} its decay runs along the token "
                "order of the whole grid, which padding changes; use attention='softmax', or decay: none"
            )
        return AF.key_padding(attn_mask)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        keys = self.key_padding(attn_mask)
        fq, fk = self.features(q, k, logit_noise)
        angles = None if self.rope is None else self.rope_angles(fq.shape[-2], fq)
        if self.decay == "none":
            eps = self.eps * self.head_dim**0.5
            if angles is not None:
                return decoupled_linear(fq, AF.mask_keys(fk, keys), angles, v, eps, self.impl, 1)
            out = AF.linear_attention(fq, fk, v.to(fq.dtype), "identity", eps, self.impl, key_mask=keys)
            return out.to(v.dtype)
        if self.order == "snake":
            return lion_snake(fq, fk, v, self._snake_gates(x, fq), self._orders(x), self.eps, self.chunk, angles)
        return lion_chunked(fq, fk, v, self.log_gates(x, fq), self.eps, self.chunk, angles)

    def _orders(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return snake_orders(self.current_grid(x.shape[1]), self.num_prefix_tokens, x.device)

    def _snake_gates(self, x: torch.Tensor, like: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.log_gates(x, like), self.log_gates(x, like, column=True)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        """The implied weights' rows normalised; with ``rope`` their absolute value (the turned weights are signed)."""
        fq, fk = self.features(q, k)
        fk = AF.mask_keys(fk, self.key_padding(attn_mask))
        if self.rope is None:
            attn = fq[:, :, query_index] @ fk.transpose(-2, -1)
        else:
            rq, rk = rotate_all(self.rope_angles(fq.shape[-2], fq), fq, fk)
            attn = (rq[:, :, query_index] @ rk.transpose(-2, -1)).abs()
        if self.order == "snake":
            attn = attn * snake_mask(self._snake_gates(x, fq), self._orders(x), query_index)
        elif self.decay != "none":
            attn = attn * decay_mask(self.log_gates(x, fq), query_index)
        return attn / (attn.sum(-1, keepdim=True) + self.eps * self.head_dim**0.5)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", decay={self.decay}, order={self.order}, chunk={self.chunk}"
