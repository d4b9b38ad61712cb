"""Attention as pure functions of (B, H, N, D) tensors, one formula each (docs/mechanisms.md).

``*_attention`` returns the output (B, H, Nq, Dv); ``*_probs`` returns the (implied) attention
matrix (B, H, Nq, Nk) of the same mechanism, used by the eager paths, diagnostics and tests.
Sums over tokens accumulate in fp32 whatever the input dtype.

Logit noise (docs/mechanisms.md section 6) is Gaussian noise of std ``logit_noise`` on the logits; mechanisms
without logits take the per-key factor exp(eps_j) on their key features instead, which keeps
them O(n). ``logit_noise=0`` never draws a random number: the result is bit-identical to the
noiseless call.
"""

from __future__ import annotations

import math
from typing import Optional, Union, overload

import torch
import torch.nn.functional as F

from vitzoo.kernels.feature_maps import feature_map as _feature_map
from vitzoo.kernels.feature_maps import mask_keys
from vitzoo.kernels.naive import naive_linear_attention

__all__ = [
    "softmax_attention",
    "softmax_probs",
    "linear_attention",
    "kernel_probs",
    "taylor_attention",
    "efficient_attention",
    "efficient_probs",
    "entropy_scale",
    "query_scale",
    "noise_draw",
    "causal_keep",
    "SCALE_MODES",
    "logit_scale",
    "check_scale",
    "additive_mask",
    "key_padding",
    "mask_keys",
    "key_count",
    "no_keys",
    "safe_softmax",
    "masked_softmax",
    "eager_checks",
    "LINEAR_IMPLS",
    "GUARD_EPS",
    "acc",
    "key_noise",
]

LINEAR_IMPLS = ("auto", "triton", "torch", "eager")
# The eps of the normalisers that have none (InLine's sum of key weights, Efficient's with decoupled RoPE): below
# rounding for an image with keys (whose normaliser is about 1 or n), and 0 / eps = 0 with finite gradients for an
# image with no key, instead of 0 / 0.
GUARD_EPS = 1e-12
Scale = Union[float, torch.Tensor, None]


def acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least fp32: half inputs are promoted, fp32 and fp64 stay as they are."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@overload
def entropy_scale(head_dim: int, num_keys: int, train_keys: int) -> float: ...
@overload
def entropy_scale(head_dim: int, num_keys: torch.Tensor, train_keys: int) -> torch.Tensor: ...
@overload
def entropy_scale(head_dim: int, num_keys: Union[int, torch.Tensor], train_keys: int) -> Union[float, torch.Tensor]: ...
def entropy_scale(head_dim: int, num_keys: Union[int, torch.Tensor], train_keys: int) -> Union[float, torch.Tensor]:
    """Entropy-invariant scale kappa*log(n)/d with kappa = sqrt(d)/log(n_train) (docs/mechanisms.md section 1).

    Equals 1/sqrt(d) at ``num_keys == train_keys`` and grows like log(n) beyond it. ``num_keys`` may
    be a tensor of per-query counts (the keys each query attends under a mask): a tensor of scales.
    """
    if train_keys < 2 or (not isinstance(num_keys, torch.Tensor) and num_keys < 1):
        raise ValueError(
            f"log_n scale needs train_keys >= 2 and num_keys >= 1, got {train_keys}, {num_keys}; "
            "train at more than one token, or use scale: sqrt_d"
        )
    log_n = num_keys.clamp_min(2).log() if isinstance(num_keys, torch.Tensor) else math.log(max(num_keys, 2))
    return math.sqrt(head_dim) / math.log(train_keys) * log_n / head_dim


SCALE_MODES = ("sqrt_d", "log_n")  # the scale option of the mechanisms with softmax logits


@overload
def logit_scale(mode: str, head_dim: int, num_keys: int, train_keys: Optional[int]) -> float: ...
@overload
def logit_scale(
    mode: str, head_dim: int, num_keys: Union[int, torch.Tensor], train_keys: Optional[int]
) -> Union[float, torch.Tensor]: ...
def logit_scale(
    mode: str, head_dim: int, num_keys: Union[int, torch.Tensor], train_keys: Optional[int]
) -> Union[float, torch.Tensor]:
    """1/sqrt(d) (``sqrt_d``) or kappa*log(n)/d equal to it at ``train_keys`` (``log_n``; a tensor of counts, e.g.
    each image's keys under a mask, gives a tensor of scales)."""
    if mode == "sqrt_d":
        return head_dim**-0.5
    assert train_keys is not None, "scale='log_n' needs train_keys (check_scale rejects it at build time)"
    return entropy_scale(head_dim, num_keys, train_keys)


def check_scale(mode: str, train_keys: Optional[int]) -> None:
    """Validate a ``scale`` option at build time."""
    if mode not in SCALE_MODES:
        raise ValueError(f"unknown scale={mode!r}; choose one of {list(SCALE_MODES)}")
    if mode != "log_n":
        return
    if not train_keys:
        raise ValueError(
            "scale='log_n' needs the training token count: build it inside a vitzoo model "
            "or set train_tokens=<tokens at training resolution>"
        )
    if train_keys < 2:
        raise ValueError(
            f"scale='log_n' needs at least 2 tokens at training, got {train_keys} (log 1 = 0 sets no "
            "scale); use scale: sqrt_d, or more tokens (a larger image, a class token)"
        )


def query_scale(
    q: torch.Tensor, num_keys: Union[int, torch.Tensor], train_keys: Optional[int]
) -> Union[float, torch.Tensor]:
    """The scale of q's rows: 1/sqrt(d) without ``train_keys``, else the log-n scale of the keys each query
    attends, a tensor in q's dtype for per-query counts (under a mask, within windows), computed in fp32 or wider."""
    if train_keys is None:
        return q.shape[-1] ** -0.5
    if not isinstance(num_keys, torch.Tensor):
        return entropy_scale(q.shape[-1], num_keys, train_keys)
    return entropy_scale(q.shape[-1], num_keys.to(acc(q).dtype), train_keys).to(q.dtype)


def noise_draw(shape, sigma: float, device, dtype) -> torch.Tensor:
    """N(0, sigma^2) of ``shape``: the Gaussian logit noise every mechanism with logits adds (one draw rule)."""
    return torch.randn(shape, device=device, dtype=dtype) * sigma


def attended_keys(attn_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Keys each query attends under ``attn_mask`` (bool: True = attend; additive: finite), shape (..., Nq, 1)."""
    if attn_mask is None:
        return None
    keep = attn_mask if attn_mask.dtype == torch.bool else attn_mask > float("-inf")
    return keep.sum(-1, keepdim=True)


@overload
def additive_mask(attn_mask: None, like: torch.Tensor) -> None: ...
@overload
def additive_mask(attn_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor: ...
@overload
def additive_mask(attn_mask: Optional[torch.Tensor], like: torch.Tensor) -> Optional[torch.Tensor]: ...
def additive_mask(attn_mask: Optional[torch.Tensor], like: torch.Tensor) -> Optional[torch.Tensor]:
    """A boolean keep-mask (True = attend) or an additive float mask, as an additive fp mask."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    return torch.zeros(attn_mask.shape, dtype=like.dtype, device=like.device).masked_fill(~attn_mask, float("-inf"))


def key_padding(attn_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The keys an ``attn_mask`` lets through, (B or 1, 1, Nk) bool, when the mask is the same for every query (key
    padding); None for no mask. This is the one way an O(n) mechanism reads a mask.

    Takes timm's boolean form (True = attend): (B, 1, 1, Nk) for keys alone, or (B, 1, Nq, Nk) whose rows are each
    either that key row or all False (a padded query, as timm's NaFlex ``create_attention_mask`` builds it); a 2-D
    or 3-D mask broadcasts as in SDPA. A mask that differs by query or by head, or an additive float one, is a
    ValueError: O(n) forms never form the n x n matrix, and padding belongs to an image, not a head. Under
    torch.compile / torch.export and the tracing exporters the rows are not compared (a check on values).
    """
    if attn_mask is None:
        return None
    one_head = attn_mask.dim() < 4 or attn_mask.shape[1] == 1
    if attn_mask.dtype != torch.bool or not 2 <= attn_mask.dim() <= 4 or not one_head:
        raise ValueError(
            f"an O(n) mechanism takes a boolean attn_mask (B, 1, 1, N) or (B, 1, N, N) with True = attend, got "
            f"{attn_mask.dtype} {tuple(attn_mask.shape)}; pass key padding as a bool mask, or use attention='softmax'"
        )
    attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + attn_mask.shape)  # (N, N) broadcasts as SDPA's
    keys = attn_mask.any(dim=-2, keepdim=True) if attn_mask.shape[-2] > 1 else attn_mask
    if attn_mask.shape[-2] > 1 and eager_checks():
        rows_ok = (attn_mask == keys) | ~attn_mask.any(dim=-1, keepdim=True)
        if not bool(rows_ok.all()):
            raise ValueError(
                "this attn_mask differs from query to query, and an O(n) mechanism takes key padding only (each "
                "row the same keys, or none for a padded query); use attention='softmax' for other masks"
            )
    return keys.squeeze(-2)


def eager_checks() -> bool:
    """Whether checks that read tensor values may run: not under torch.compile / torch.export or a tracing exporter,
    which cannot branch on data."""
    return not (torch.compiler.is_compiling() or graph_capture())


def key_count(key_mask: Optional[torch.Tensor], like: torch.Tensor) -> Union[int, torch.Tensor]:
    """The keys that count, per (batch, head) as (B or 1, H or 1, 1, 1) in ``like``'s dtype under a ``key_mask``,
    else the token count of ``like`` (B, H, N, D): n of each image in the formulas that divide by n.

    At least 1: an image with no key has every sum over keys 0, and n = 1 keeps its normalisers finite (its output
    0 with zero gradients, not 0/0) while changing nothing for an image with keys."""
    if key_mask is None:
        return like.shape[-2]
    return key_mask.sum(-1).clamp_min(1).to(like.dtype)[..., None, None]


def no_keys(attn_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """(..., Nq, 1) bool: the queries that attend no key under ``attn_mask`` (bool: True = attend; additive: finite),
    e.g. every query of an image whose keys are all padding; None for no mask."""
    if attn_mask is None:
        return None
    keep = attn_mask if attn_mask.dtype == torch.bool else attn_mask > float("-inf")
    return ~keep.any(-1, keepdim=True)


def safe_softmax(logits: torch.Tensor, empty: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax over the last axis of logits whose mask is already added; the rows ``empty`` marks (all -inf: a query
    that attends no key) are 0 with zero gradients, as SDPA's fully masked rows, not NaN."""
    if empty is None:
        return logits.softmax(dim=-1)
    return logits.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)


def masked_softmax(logits: torch.Tensor, keep: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax along ``dim`` over the entries ``keep`` (bool, broadcasting to logits) lets through, 0 at the others;
    a slice that lets none through is 0 with zero gradients (an image with no key), not NaN."""
    empty = ~keep.any(dim, keepdim=True)
    return logits.masked_fill(~(keep | empty), float("-inf")).softmax(dim=dim).masked_fill(empty, 0.0)


def causal_keep(num_queries: int, num_keys: int, device) -> torch.Tensor:
    """The causal rows as a bool matrix: query i attends keys 0..i."""
    return torch.ones(num_queries, num_keys, dtype=torch.bool, device=device).tril()


def causal_mask(q: torch.Tensor, k: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Causal rows (query i attends keys 0..i) combined with ``attn_mask``: bool alone, additive with a mask."""
    keep = causal_keep(q.shape[-2], k.shape[-2], q.device)
    if attn_mask is None:
        return keep
    return additive_mask(attn_mask, q) + additive_mask(keep, q)


def _logit_bias(q: torch.Tensor, k: torch.Tensor, attn_mask, logit_noise: float, dtype) -> Optional[torch.Tensor]:
    """The additive term on the logits: the mask plus Gaussian noise when ``logit_noise > 0``."""
    bias = additive_mask(attn_mask, q.new_empty((), dtype=dtype))
    if logit_noise > 0:
        shape = q.shape[:-1] + (k.shape[-2],)
        noise = noise_draw(shape, logit_noise, q.device, dtype)
        bias = noise if bias is None else noise + bias.to(dtype)
    return bias


def softmax_probs(
    q: torch.Tensor, k: torch.Tensor, scale: Scale = None, attn_mask=None, logit_noise: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T * scale + mask + noise), computed in fp32 or wider: (B, H, Nq, Nk); a query that attends no key
    gets a row of 0 (as SDPA)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = (acc(q) * scale) @ acc(k).transpose(-2, -1)
    bias = _logit_bias(q, k, attn_mask, logit_noise, logits.dtype)
    if bias is not None:
        logits = logits + bias
    return safe_softmax(logits, no_keys(attn_mask))


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: Scale = None,
    logit_noise: float = 0.0,
    attn_mask: Optional[torch.Tensor] = None,
    fused: bool = True,
    return_attn: bool = False,
    dropout_p: float = 0.0,
):
    """Scaled dot-product attention softmax(q k^T * scale) v (docs/mechanisms.md section 1).

    ``fused`` goes through ``F.scaled_dot_product_attention`` (noise rides in as an additive
    mask); the eager twin computes the same function and, with ``return_attn``, also returns
    the attention matrix as ``(out, attn)``.
    """
    if fused and not return_attn:
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if isinstance(scale, torch.Tensor):
            scale = float(scale)
        bias = _logit_bias(q, k, attn_mask, logit_noise, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    attn = softmax_probs(q, k, scale, attn_mask, logit_noise)
    out = (F.dropout(attn, dropout_p) @ acc(v)).to(v.dtype)
    return (out, attn) if return_attn else out


def key_noise(k: torch.Tensor, logit_noise: float) -> Optional[torch.Tensor]:
    """Per-key log-factors eps_j ~ N(0, sigma^2), shape (B, H, Nk, 1), or None at sigma = 0."""
    if logit_noise <= 0:
        return None
    return torch.randn(k.shape[:-1] + (1,), device=k.device, dtype=acc(k).dtype) * logit_noise


def _kernel_features(q, k, feature_map: str, logit_noise: float, key_mask: Optional[torch.Tensor] = None):
    phi = _feature_map(feature_map)
    fq, fk = phi(acc(q)), phi(acc(k))
    noise = key_noise(k, logit_noise)
    if noise is not None:
        fk = fk * noise.exp()
    return fq, mask_keys(fk, key_mask)


def kernel_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    feature_map: str = "elu",
    eps: float = 1e-6,
    causal: bool = False,
    logit_noise: float = 0.0,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The implied matrix A_ij = phi(q_i).phi(k_j) / (sum_j' phi(q_i).phi(k_j') + eps); 0 for masked keys, and a
    zero row for a query with no key (eps = 0 included)."""
    fq, fk = _kernel_features(q, k, feature_map, logit_noise, key_mask)
    sim = fq @ fk.transpose(-2, -1)
    if causal:
        sim = sim.tril()
    return sim / (sim.sum(dim=-1, keepdim=True) + eps).clamp_min(torch.finfo(sim.dtype).tiny)


def _linear_eager(q, k, v, feature_map: str, eps: float, causal: bool, logit_noise: float, key_mask):
    """The plain formula (kernels' naive reference) on the features, key noise and the key mask applied first."""
    fq, fk = _kernel_features(q, k, feature_map, logit_noise, key_mask)
    return naive_linear_attention(fq, fk, v, "identity", eps, causal)


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: str = "elu",
    eps: float = 1e-6,
    impl: str = "auto",
    causal: bool = False,
    logit_noise: float = 0.0,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Kernel attention phi(q) (sum_j phi(k_j)^T v_j) / (phi(q).sum_j phi(k_j) + eps) in O(n d^2).

    ``key_mask`` (bool (B or 1, H or 1, Nk), True = the key counts; ``key_padding`` reads it from an attn_mask)
    leaves the other keys out of both sums on every path.

    ``impl``: ``eager`` is the plain formula; ``torch`` (chunked autograd Function) and
    ``triton`` (GPU kernels) are the fused non-causal paths in ``vitzoo.kernels``; ``auto``
    takes Triton on CUDA, the torch path elsewhere, and the eager formula for the causal form
    and for key noise (both still O(n)). The fused paths are one custom op to torch.compile and
    torch.export; under jit tracing and ONNX export every impl runs the eager formula (``graph_capture``).
    """
    if impl not in LINEAR_IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {list(LINEAR_IMPLS)}")
    _feature_map(feature_map)
    if impl != "eager" and graph_capture():
        impl = "eager"  # a jit tracer or ONNX exporter records the plain formula, never the fused call
    if causal or logit_noise > 0:
        if impl in ("torch", "triton"):
            what = "causal=True" if causal else "logit_noise > 0"
            raise ValueError(
                f"impl={impl!r} is the fused non-causal, noiseless path; with {what} use impl='auto' or 'eager'"
            )
        impl = "eager"
    if impl == "eager":
        return _linear_eager(q, k, v, feature_map, eps, causal, logit_noise, key_mask)
    from vitzoo.kernels import fused_linear_attention

    return fused_linear_attention(q, k, v, feature_map=feature_map, eps=eps, impl=impl, key_mask=key_mask)


def graph_capture() -> bool:
    """Whether this call is being recorded by a tracer that cannot carry the fused custom op (torch.jit
    trace/script, either ONNX exporter): the naive formula runs there instead. torch.compile and
    torch.export carry the op itself (``vitzoo::linear_attention``)."""
    return torch.jit.is_tracing() or torch.jit.is_scripting() or torch.onnx.is_in_onnx_export()


def taylor_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    eps: float = 1e-6,
    impl: str = "auto",
    causal: bool = False,
    logit_noise: float = 0.0,
) -> torch.Tensor:
    """sim(q, k) = 1 + cos(q, k) (docs/mechanisms.md section 3): linear attention with phi(x) = [1, x/|x|]."""
    return linear_attention(q, k, v, "taylor", eps, impl, causal, logit_noise)


def efficient_probs(
    q: torch.Tensor, k: torch.Tensor, logit_noise: float = 0.0, key_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The implied matrix softmax_D(q) softmax_N(k)^T of Efficient Attention; rows sum to 1."""
    qs, ks = _efficient_factors(q, k, logit_noise, key_mask)
    return qs @ ks.transpose(-2, -1)


def _efficient_factors(q, k, logit_noise: float, key_mask: Optional[torch.Tensor] = None):
    logits = acc(k)
    noise = key_noise(k, logit_noise)
    if noise is not None:
        logits = logits + noise  # the same eps_j on every channel of key j
    ks = logits.softmax(dim=-2) if key_mask is None else masked_softmax(logits, key_mask.unsqueeze(-1), dim=-2)
    return acc(q).softmax(dim=-1), ks


def efficient_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logit_noise: float = 0.0,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Efficient Attention (Shen et al.): softmax_D(q) (softmax_N(k)^T v); the softmax over tokens runs over the keys
    of ``key_mask``.

    Not the exp(k) shortcut with a separate denominator (docs/mechanisms.md).
    """
    qs, ks = _efficient_factors(q, k, logit_noise, key_mask)
    return (qs @ (ks.transpose(-2, -1) @ acc(v))).to(v.dtype)
