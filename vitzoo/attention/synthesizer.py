"""Synthesizer attention (Tay et al., docs/mechanisms.md section 4): out = softmax(B + noise) V, B made without q.k.

Each kind of logit generator is one small module returning (B|1, H, Nq, Nk) logits for a token
``Layout`` (prefix tokens, then an h x w patch grid); the registered mechanisms compose them:
``synth_dense``, ``synth_random``, ``synth_factorized_dense``, ``synth_factorized_random`` and
``synth_mix`` (B = sum_i alpha_i B_i, alpha on the simplex, parts may include vanilla softmax).

Resolution. B is tied to the layout it was built for. At another token count (``interpolate:
true``) every token axis of B that indexes positions is resampled as a 2-D grid: prefix entries
are kept, grid entries are bilinear (align_corners=False), so prefix<->prefix logits stay,
prefix->grid and grid->prefix logits are resampled along the grid axis. Dense forms predict one
row per query, so only their key axis is resampled. Bilinear resampling is linear, so it is
applied to the factors (R1, R2, the dense weights) rather than to B when that is cheaper: the
result is the same matrix. No temperature term is added: softmax ignores a constant shift such as
log(n/n0), and a logit bump keeps covering the same image area, so rows keep their spatial
sharpness; the prefix keys' share of attention shrinks by about g0/g (g grid keys instead of g0),
which is left as is. In exchange, a state dict saved at another grid (each generator is a
``grid.GridModule``, resampled on load from its persistent ``layout`` buffer) gives exactly the
function the saved model computes at this grid with ``interpolate: true``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .grid import GridBoundAttention, GridModule, Layout, resample_tokens
from .registry import register_attention

__all__ = [
    "DenseLogits",
    "FactorizedDenseLogits",
    "RandomLogits",
    "FactorizedRandomLogits",
    "DotProductLogits",
    "MixLogits",
    "SynthesizerAttention",
    "SynthDenseAttention",
    "SynthRandomAttention",
    "SynthFactorizedDenseAttention",
    "SynthFactorizedRandomAttention",
    "SynthMixAttention",
    "MIX_PARTS",
]

MIX_PARTS = ("dense", "random", "factorized_dense", "factorized_random", "softmax")


# -- logit generators ------------------------------------------------------------------------
class DenseLogits(GridModule):
    """Dense: B = relu(x W1 + b1) W2 + b2, each token's own row of logits over the built keys.

    W2 maps ``hidden`` (default: dim) to H * ``width`` (default: the built token count).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        layout: Layout,
        hidden: Optional[int] = None,
        width: Optional[int] = None,
        device=None,
        dtype=None,
    ):
        super().__init__(layout, device)
        hidden = hidden or dim
        if hidden < 1:
            raise ValueError(f"hidden must be a positive width, got {hidden}")
        self.num_heads = num_heads
        self.fc1 = nn.Linear(dim, hidden, device=device, dtype=dtype)
        self.fc2 = nn.Linear(hidden, num_heads * (width or layout.tokens), device=device, dtype=dtype)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, H, N, width): what W2 predicts for every token.

        The head axis is split by a reshape to x's own sizes: the TorchScript ONNX exporter gives an unflatten's
        output a fixed batch size, which the resampled logits' reshape would then keep."""
        rows = AF.acc(self.fc2(F.relu(self.fc1(x))))
        return rows.reshape(*x.shape[:-1], self.num_heads, -1).transpose(1, 2)

    def key_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """Predicted rows -> logits over the built keys."""
        return rows

    def forward(self, x, q, k, layout: Layout) -> torch.Tensor:
        return resample_tokens(self.key_logits(self.rows(x)), -1, self.built, layout)

    def resample_state(self, state, prefix, src):
        for key in ("fc2.weight", "fc2.bias"):
            self._resample_entry(state, prefix + key, src, dims=(1,), heads=self.num_heads)


class FactorizedDenseLogits(DenseLogits):
    """Factorized dense: rows B1 (n x a), B2 (n x b), a*b = grid tokens, combined element-wise.

    The paper tiles B1 and B2 to length a*b and multiplies them; tiling both the same way gives
    only lcm(a, b) distinct products (8 for a = b = 8), so -- the seed's "one should be
    transposed" -- B1 repeats each entry b times and B2 is tiled a times:
    B[i, r*b + c] = B1[i, r] * B2[i, c], the outer product over an a x b key grid. The default
    factors are the patch grid (h, w), a row-by-column logit. Prefix keys cannot sit on that grid:
    they get their own dense logits (W2 predicts prefix + a + b values per head).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        layout: Layout,
        hidden: Optional[int] = None,
        factors: Optional[Sequence[int]] = None,
        device=None,
        dtype=None,
    ):
        pair = _check_factors(factors, layout)
        super().__init__(dim, num_heads, layout, hidden, layout.prefix + sum(pair), device, dtype)
        self.factors = pair

    def key_logits(self, rows):
        pre, b1, b2 = rows.split([self.built.prefix, *self.factors], dim=-1)
        return torch.cat([pre, (b1.unsqueeze(-1) * b2.unsqueeze(-2)).flatten(-2)], dim=-1)

    def resample_state(self, state, prefix, src):
        if self.factors != (self.built.h, self.built.w):
            raise ValueError(
                f"synth_factorized_dense with factors={list(self.factors)} cannot be resampled from "
                f"grid {src.h}x{src.w}; build it with the default factors (the patch grid's h, w)"
            )
        for key in ("fc2.weight", "fc2.bias"):
            if prefix + key not in state:
                continue
            t = state[prefix + key]
            pre, b1, b2 = AF.acc(t).unflatten(0, (self.num_heads, -1)).split([src.prefix, src.h, src.w], dim=1)
            b1 = resample_tokens(b1, 1, Layout(0, 1, src.h), Layout(0, 1, self.built.h))
            b2 = resample_tokens(b2, 1, Layout(0, 1, src.w), Layout(0, 1, self.built.w))
            state[prefix + key] = torch.cat([pre, b1, b2], dim=1).flatten(0, 1).to(t.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", factors={self.factors}"


class RandomLogits(GridModule):
    """Random: B = R, one (n x n) table per head, trainable or fixed at its N(0, 1) init.

    Fixed R is a persistent buffer: no gradient, no optimizer state, but saved with the model.
    """

    def __init__(self, num_heads: int, layout: Layout, trainable: bool = True, device=None, dtype=None):
        super().__init__(layout, device)
        weight = torch.randn(num_heads, layout.tokens, layout.tokens, device=device, dtype=dtype)
        if trainable:
            self.weight = nn.Parameter(weight)
        else:
            self.register_buffer("weight", weight)
        self.trainable = trainable

    def forward(self, x, q, k, layout: Layout) -> torch.Tensor:
        w = resample_tokens(AF.acc(self.weight), 1, self.built, layout)
        return resample_tokens(w, 2, self.built, layout).unsqueeze(0)

    def resample_state(self, state, prefix, src):
        self._resample_entry(state, prefix + "weight", src, dims=(1, 2))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", trainable={self.trainable}"


class FactorizedRandomLogits(GridModule):
    """Factorized random: B = R1 R2^T, R1, R2 of shape (H, n, rank); entries of B start at unit variance."""

    def __init__(self, num_heads: int, layout: Layout, rank: int = 8, device=None, dtype=None):
        super().__init__(layout, device)
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        std = rank**-0.25
        self.r1 = nn.Parameter(torch.randn(num_heads, layout.tokens, rank, device=device, dtype=dtype) * std)
        self.r2 = nn.Parameter(torch.randn(num_heads, layout.tokens, rank, device=device, dtype=dtype) * std)

    def forward(self, x, q, k, layout: Layout) -> torch.Tensor:
        r1 = resample_tokens(AF.acc(self.r1), 1, self.built, layout)
        r2 = resample_tokens(AF.acc(self.r2), 1, self.built, layout)
        return (r1 @ r2.transpose(-2, -1)).unsqueeze(0)

    def resample_state(self, state, prefix, src):
        for key in ("r1", "r2"):
            self._resample_entry(state, prefix + key, src, dims=(1,))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", rank={self.r1.shape[-1]}"


class DotProductLogits(nn.Module):
    """The vanilla part of a mixture: q k^T * scale (``sqrt_d`` or the log-n scale)."""

    def __init__(self, head_dim: int, scale: str = "sqrt_d", train_tokens: Optional[int] = None):
        super().__init__()
        AF.check_scale(scale, train_tokens)
        self.head_dim, self.scale, self.train_tokens = head_dim, scale, train_tokens

    @property
    def uses_log_n(self) -> bool:
        return self.scale == "log_n"

    def forward(self, x, q, k, layout) -> torch.Tensor:
        s = AF.logit_scale(self.scale, self.head_dim, k.shape[-2], self.train_tokens)
        return (AF.acc(q) * s) @ AF.acc(k).transpose(-2, -1)

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


class MixLogits(nn.Module):
    """B = sum_i alpha_i B_i with alpha = softmax(weight): learnable weights on the simplex (start uniform)."""

    def __init__(self, parts: dict, device=None):
        super().__init__()
        self.parts = nn.ModuleDict(parts)
        self.weight = nn.Parameter(torch.zeros(len(parts), device=device))

    @property
    def alpha(self) -> torch.Tensor:
        return AF.acc(self.weight).softmax(dim=0)

    def forward(self, x, q, k, layout) -> torch.Tensor:
        return sum(a * part(x, q, k, layout) for a, part in zip(self.alpha, self.parts.values()))


# -- mechanisms -------------------------------------------------------------------------------
class SynthesizerAttention(GridBoundAttention):
    """softmax(B + noise) V with the logits B from ``self.synth`` (set by the subclass).

    ``interpolate`` resamples B at another token layout (``GridBoundAttention``).
    """

    no_rope = "it has no queries and keys to rotate (its weights are synthesised or learned per position)"
    projections: Sequence[str] = ("v",)
    synth: nn.Module  # the logit generator, set by the subclass

    def logits(self, x, q, k, attn_mask, is_causal) -> torch.Tensor:
        """Noiseless logits B (+ mask) for the current input: (B|1, H, N, N), fp32 or wider."""
        if self.image_grids is not None:
            raise ValueError(
                f"{type(self).__name__}'s logits index the token pairs of one grid, not of each image's own; run "
                "images of one size per batch, or use attention='softmax' for a list of images"
            )
        out = self.synth(x, q, k, self.target_layout(x.shape[1]))
        if attn_mask is not None:
            out = out + AF.additive_mask(attn_mask, out)
        if is_causal:
            out = out.masked_fill(~AF.causal_keep(out.shape[-2], out.shape[-1], out.device), float("-inf"))
        return out

    @staticmethod
    def no_keys(x: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool) -> Optional[torch.Tensor]:
        """The queries that attend no key under ``attn_mask`` (and the causal rows): their rows are 0."""
        if attn_mask is None:
            return None
        return AF.no_keys(AF.causal_mask(x, x, attn_mask) if is_causal else attn_mask)

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        logits = self.logits(x, q, k, attn_mask, is_causal)
        if logit_noise > 0:
            logits = logits + AF.noise_draw(v.shape[:2] + logits.shape[-2:], logit_noise, v.device, logits.dtype)
        attn = self.attn_drop(
            AF.safe_softmax(logits, self.no_keys(x, attn_mask, is_causal)).expand(v.shape[0], -1, -1, -1)
        )
        return (attn @ AF.acc(v)).to(v.dtype)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        logits = self.logits(x, q, k, attn_mask, is_causal)[:, :, query_index]
        empty = self.no_keys(x, attn_mask, is_causal)
        if empty is not None and empty.shape[-2] > 1:
            empty = empty[..., query_index, :]
        return AF.safe_softmax(logits, empty).expand(x.shape[0], -1, -1, -1)


@register_attention("synth_dense")
class SynthDenseAttention(SynthesizerAttention):
    """Dense Synthesizer: B = relu(x W1 + b1) W2 + b2 (``hidden`` width of W1, default dim)."""

    def __init__(self, dim: int, num_heads: int = 8, *args, hidden: Optional[int] = None, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.synth = DenseLogits(dim, self.num_heads, self.built_layout, hidden, **_dd(kwargs))


@register_attention("synth_random")
class SynthRandomAttention(SynthesizerAttention):
    """Random Synthesizer: B = R per head, ``trainable`` or fixed at its random init."""

    def __init__(self, dim: int, num_heads: int = 8, *args, trainable: bool = True, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.synth = RandomLogits(self.num_heads, self.built_layout, trainable, **_dd(kwargs))


@register_attention("synth_factorized_dense")
class SynthFactorizedDenseAttention(SynthesizerAttention):
    """Factorized dense Synthesizer: B[i, (r, c)] = B1[i, r] B2[i, c], ``factors`` (a, b) default the grid (h, w)."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        hidden: Optional[int] = None,
        factors: Optional[Sequence[int]] = None,
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.synth = FactorizedDenseLogits(dim, self.num_heads, self.built_layout, hidden, factors, **_dd(kwargs))


@register_attention("synth_factorized_random")
class SynthFactorizedRandomAttention(SynthesizerAttention):
    """Factorized random Synthesizer: B = R1 R2^T of rank ``rank``."""

    def __init__(self, dim: int, num_heads: int = 8, *args, rank: int = 8, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.synth = FactorizedRandomLogits(self.num_heads, self.built_layout, rank, **_dd(kwargs))


@register_attention("synth_mix")
class SynthMixAttention(SynthesizerAttention):
    """Mixture: B = sum_i alpha_i B_i over ``parts`` (see ``MIX_PARTS``), alpha learnable on the simplex.

    ``softmax`` is the vanilla q k^T * scale (``scale: sqrt_d | log_n``); q and k are projected
    only when it is a part. The other options go to the parts that use them.
    """

    no_rope = (
        "a rotation would reach its softmax part only (the synthesised parts' weights are learned per position); use "
        "attention='softmax' with rope"
    )

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        parts: Sequence[str] = ("random", "softmax"),
        scale: str = "sqrt_d",
        train_tokens: Optional[int] = None,
        hidden: Optional[int] = None,
        factors: Optional[Sequence[int]] = None,
        rank: int = 8,
        trainable: bool = True,
        **kwargs,
    ):
        parts = _check_parts(parts)
        self.projections = ("q", "k", "v") if "softmax" in parts else ("v",)  # read by ZooAttention.__init__
        super().__init__(dim, num_heads, *args, **kwargs)
        dd, heads, layout = _dd(kwargs), self.num_heads, self.built_layout
        train_tokens = train_tokens or layout.tokens
        AF.check_scale(scale, train_tokens)
        build = {
            "dense": lambda: DenseLogits(dim, heads, layout, hidden, **dd),
            "random": lambda: RandomLogits(heads, layout, trainable, **dd),
            "factorized_dense": lambda: FactorizedDenseLogits(dim, heads, layout, hidden, factors, **dd),
            "factorized_random": lambda: FactorizedRandomLogits(heads, layout, rank, **dd),
            "softmax": lambda: DotProductLogits(self.head_dim, scale, train_tokens),
        }
        self.synth: MixLogits = MixLogits({p: build[p]() for p in parts}, device=dd["device"])

    def logits(self, x, q, k, attn_mask, is_causal) -> torch.Tensor:
        """A log-n ``softmax`` part counts the keys each query attends (docs/mechanisms.md section 1): under a
        mask or causal rows, q's rows carry log(attended) / log(all keys) (the part scales at all keys)."""
        dot = cast(DotProductLogits, self.synth.parts["softmax"]) if "softmax" in self.synth.parts else None
        if dot is not None and dot.uses_log_n and (attn_mask is not None or is_causal):
            counts = AF.attended_keys(AF.causal_mask(q, k, attn_mask) if is_causal else attn_mask)
            assert counts is not None and dot.train_tokens is not None  # a mask is given; log_n has train_tokens
            ratio = AF.entropy_scale(dot.head_dim, counts, dot.train_tokens) / AF.entropy_scale(
                dot.head_dim, k.shape[-2], dot.train_tokens
            )
            q = q * ratio.to(q.dtype)
        return super().logits(x, q, k, attn_mask, is_causal)


def _dd(kwargs: dict) -> Dict[str, Any]:
    return {"device": kwargs.get("device"), "dtype": kwargs.get("dtype")}


def _check_factors(factors: Optional[Sequence[int]], layout: Layout) -> Tuple[int, int]:
    if factors is None:
        return layout.h, layout.w
    grid = layout.h * layout.w
    pair = tuple(int(f) for f in factors)
    if len(pair) != 2 or min(pair) < 1 or pair[0] * pair[1] != grid:
        raise ValueError(
            f"factors={list(factors)} must be two positive integers whose product is the {grid} grid "
            f"tokens ({layout.h}x{layout.w}; prefix tokens get their own logits), e.g. "
            f"factors: [{layout.h}, {layout.w}]"
        )
    return pair


def _check_parts(parts: Sequence[str]) -> list:
    if isinstance(parts, str) or not parts:
        raise ValueError(f"synth_mix parts must be a non-empty list drawn from {list(MIX_PARTS)}, got {parts!r}")
    parts = [str(p) for p in parts]
    unknown = [p for p in parts if p not in MIX_PARTS]
    if unknown:
        raise ValueError(f"unknown synth_mix part(s) {unknown}; choose from {list(MIX_PARTS)}")
    if len(set(parts)) != len(parts):
        raise ValueError(f"synth_mix parts {parts} repeat a part; list each at most once")
    return parts
