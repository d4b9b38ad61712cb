"""Chunked torch path for non-causal kernel attention: an autograd Function with the analytic backward.

out_i = phi(q_i) S / (phi(q_i).z + eps),  S = sum_j phi(k_j)^T v_j,  z = sum_j phi(k_j).

Forward and backward walk over the tokens in chunks, so the working set is a few cache-sized
fp32 buffers whatever n is; only q, k, v, S and z are saved (features are recomputed). With
g = dO / den, a = g S^T and w = (phi(q).a) / den the gradients are

    dphi(q) = a - w z^T,   dS = sum_i phi(q_i)^T g_i,   dz = -sum_i w_i phi(q_i),
    dphi(k) = v dS^T + dz,  dv = phi(k) dS,

i.e. six (chunk x d x d) matmuls in all and one read of q, k, v, dO. Sums run in fp32 for any
input dtype; outputs and gradients come back in the inputs' dtypes.

Each chunk's work runs as one of two step sets with the same signatures: ``_KernelSteps``, the
compiled CPU kernel (cpu_kernel.py; the feature map and the element-wise work fused into row loops,
float32 / float64 CPU tensors, elu and relu), or ``_TorchSteps`` in torch ops (any device, dtype
and feature map; the reference the kernel is tested against).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch

from vitzoo.attention.feature_maps import FEATURE_MAPS

from ._autograd import FusedLinearFunction
from ._threads import single_threaded_pool
from .cpu_kernel import CPU_KERNEL_MAPS, cpu_kernel

__all__ = ["linear_attention_torch", "chunk_tokens", "TORCH_FEATURE_MAPS"]

_CHUNK_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 24}  # per (batch*heads, chunk, features) buffer
_MIN_WORKER_TOKENS = 8  # fewer tokens per thread go to one worker ...
_MIN_PARALLEL_ELEMENTS = 1 << 16  # ... and so do inputs this small (a hand-over costs ~0.1-0.3 ms)
_OMP_SLICES_PER_THREAD = 8  # batch*heads >= this many per thread: torch's intra-op threads instead
_TAYLOR_NORM_EPS = 1e-6  # F.normalize's eps inside feature_maps.taylor
_LOG2E = math.log2(math.e)


class FeatureMap(NamedTuple):
    """``phi(x, buf) -> (f, aux)`` and ``grad(df, f, aux, out) -> dx`` (may overwrite ``df`` and
    ``f``), plus how many features phi adds to the head dim. ``aux`` is what the derivative needs
    (elu: the exp part); ``buf`` hands out scratch tensors (see ``_Scratch``)."""

    phi: Callable
    grad: Callable
    extra: int = 0


def _elu_phi(x, buf):
    # elu(x) + 1 = exp(min(x, 0)) + max(x, 0) in cheap passes (elu's own kernel is slower, and
    # exp2 is about twice as fast as exp here); the exp part is also the derivative.
    e = torch.mul(x, _LOG2E, out=buf("e", x.shape)).clamp_(max=0).exp2_()
    return torch.clamp(x, min=0, out=buf("f", x.shape)).add_(e), e


def _elu_grad(df, f, e, out):
    return torch.mul(df, e, out=out)


def _relu_phi(x, buf):
    f = torch.clamp(x, min=0, out=buf("f", x.shape))
    return f, f


def _relu_grad(df, f, aux, out):
    return torch.mul(df, f.sign_(), out=out)  # relu features are >= 0: sign(f) is the 0/1 mask


def _taylor_phi(x, buf):
    return FEATURE_MAPS["taylor"](x), x


def _taylor_grad(df, f, x, out):
    """VJP of [1, x / max(|x|, eps)]: the tangential part of dU over |x| (dU / eps below eps)."""
    unit, dunit = f[..., 1:], df[..., 1:]
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    radial = torch.linalg.vecdot(unit, dunit).unsqueeze(-1) * (norm > _TAYLOR_NORM_EPS)
    return torch.div(dunit - unit * radial, norm.clamp_min(_TAYLOR_NORM_EPS), out=out)


TORCH_FEATURE_MAPS = {
    "elu": FeatureMap(_elu_phi, _elu_grad),
    "relu": FeatureMap(_relu_phi, _relu_grad),
    "taylor": FeatureMap(_taylor_phi, _taylor_grad, extra=1),
}


def chunk_tokens(batch_heads: int, width: int, num_tokens: int, device: torch.device) -> int:
    """Tokens per chunk so that one (batch_heads, chunk, width) fp32 buffer holds ~1 MiB on CPU
    (a cache-sized working set), ~64 MiB on GPUs (few launches); at least 64 tokens, below which
    the batched matmuls lose their efficiency."""
    budget = _CHUNK_ELEMENTS.get(device.type, _CHUNK_ELEMENTS["cuda"])
    return max(64, min(num_tokens, budget // max(1, batch_heads * width)))


def _spans(lo: int, hi: int, chunk: int):
    """range(lo, hi) cut into ceil((hi - lo) / chunk) near-equal (start, end) pieces (one when empty)."""
    m = max(1, -(-(hi - lo) // max(1, chunk)))
    return [(lo + (hi - lo) * i // m, lo + (hi - lo) * (i + 1) // m) for i in range(m)]


class _Scratch:
    """Scratch tensors by name, reused from chunk to chunk of one sweep: a fresh MiB-sized
    allocation per op costs page faults that take longer than the op itself."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype, self.device, self.cache = dtype, device, {}

    def __call__(self, name: str, shape) -> torch.Tensor:
        numel = math.prod(shape)
        flat = self.cache.get(name)
        if flat is None or flat.numel() < numel:
            flat = self.cache[name] = torch.empty(numel, dtype=self.dtype, device=self.device)
        return flat[:numel].view(shape)


def _acc(x: torch.Tensor) -> torch.dtype:
    """The accumulation dtype: fp32 for fp32/bf16/fp16 inputs, fp64 for fp64 (gradcheck)."""
    return torch.promote_types(x.dtype, torch.float32)


def _rows(x: torch.Tensor, s: int, e: int, buf: _Scratch, name: str) -> torch.Tensor:
    """Tokens s:e of a (B, H, N, D) tensor as (B*H, e-s, D) in the accumulation dtype with contiguous
    rows (the kernel's row loops need them): a view when the layout and dtype allow, else a copy into scratch."""
    part = x[:, :, s:e]
    rows_contiguous = part.shape[-1] <= 1 or part.stride(-1) == 1
    merges = 1 in part.shape[:2] or part.stride(0) == part.shape[1] * part.stride(1)
    if part.dtype == buf.dtype and rows_contiguous and merges:
        return part.flatten(0, 1)  # a view (row strides of e.g. timm's packed qkv are fine for bmm)
    out = buf(name, part.shape)
    return out.copy_(part).flatten(0, 1)


def _slot(dst: torch.Tensor, s: int, e: int) -> torch.Tensor:
    """Tokens s:e of a contiguous (B, H, N, D) result as a writable (B*H, e-s, D) view."""
    return dst[:, :, s:e].flatten(0, 1)


def _bmm_into(slot: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    if slot.dtype == a.dtype:
        torch.bmm(a, b, out=slot)
    else:
        slot.copy_(torch.bmm(a, b))


def _sweep(step, n: int, chunk: int, like: torch.Tensor):
    """Sum of ``step(s, e, buf)`` (a tuple of tensors, or None) over chunks of range(n) (steps may
    also write outputs).

    On CPU with few (batch x heads) slices the tokens are cut into one contiguous range per
    intra-op thread (one range for tiny inputs), each walked chunk by chunk on a single-threaded
    worker: an OpenMP barrier per op costs more than the op here, and far more on a shared CPU.
    With many slices (a training batch) one range is walked on the calling thread and torch's
    own threads split each op over the slices; workers there would compete with the idle-spinning
    OpenMP threads of the surrounding model. Partial sums are added in a fixed order, so the
    result is deterministic for a given thread count.
    """
    def walk(lo_hi):
        buf = _Scratch(_acc(like), like.device)
        return _total(step(s, e, buf) for s, e in _spans(lo_hi[0], lo_hi[1], chunk))

    threads = torch.get_num_threads() if like.device.type == "cpu" else 1
    if threads <= 1 or like.shape[0] * like.shape[1] >= _OMP_SLICES_PER_THREAD * threads:
        return walk((0, n))
    workers = min(threads, n // _MIN_WORKER_TOKENS) if like.numel() >= _MIN_PARALLEL_ELEMENTS else 1
    ranges = _spans(0, n, -(-n // max(1, workers)))
    return _total(single_threaded_pool(len(ranges)).map(walk, ranges))


def _total(parts):
    """Element-wise sum of the parts (tuples of tensors, or None), added in order."""
    out = None
    for p in parts:
        out = p if out is None else tuple(o.add_(x) for o, x in zip(out, p))
    return out


def _rowdot(a, b, buf, dim: int = -1):
    """sum over ``dim`` of a * b (b broadcast), through a scratch product: a (..., 1) bmm costs as
    much as a full (..., d) one here, and ``vecdot`` allocates its product on every call."""
    return torch.mul(a, b, out=buf("prod", a.shape)).sum(dim)


class _TorchSteps:
    """The per-chunk steps in torch ops (any device and dtype, every feature map)."""

    def __init__(self, fm: FeatureMap, eps: float):
        self.fm, self.eps = fm, eps

    def state(self, k, v, s, e, buf):
        """This chunk's S = phi(k)^T v (BH, F, Dv) and z = sum phi(k) (BH, F): separate products, as
        an (F x Dv+1) one costs as much as (F x Dv+16) here."""
        fk, _ = self.fm.phi(_rows(k, s, e, buf, "k"), buf)
        return torch.bmm(fk.mT, _rows(v, s, e, buf, "v")), fk.sum(1)

    def output(self, q, S, z, out, s, e, buf):
        fq, _ = self.fm.phi(_rows(q, s, e, buf, "q"), buf)
        num = torch.bmm(fq, S, out=buf("num", fq.shape[:2] + S.shape[-1:]))
        den = _rowdot(fq, z.unsqueeze(1), buf).add_(self.eps).unsqueeze(-1)
        torch.div(num, den, out=_slot(out, s, e))

    def query_grad(self, q, dout, S, z, dq, s, e, buf):
        """dq for tokens s:e (when wanted) and their share of dS, dz."""
        zr = z.unsqueeze(1)
        fq, aux = self.fm.phi(_rows(q, s, e, buf, "q"), buf)
        den = _rowdot(fq, zr, buf).add_(self.eps).unsqueeze(-1)
        g = torch.div(_rows(dout, s, e, buf, "do"), den, out=buf("g", fq.shape[:2] + S.shape[-1:]))
        a = torch.bmm(g, S.mT, out=buf("a", fq.shape))
        w = _rowdot(fq, a, buf).unsqueeze(-1).div_(den)
        dS, dz = torch.bmm(fq.mT, g), _rowdot(fq, w, buf, dim=1).neg_()
        if dq is not None:
            self.fm.grad(a.addcmul_(w, zr, value=-1.0), fq, aux, out=_slot(dq, s, e))
        return dS, dz

    def key_value_grad(self, k, v, dS, dz, dk, dv, s, e, buf):
        fk, aux = self.fm.phi(_rows(k, s, e, buf, "k"), buf)
        if dv is not None:
            _bmm_into(_slot(dv, s, e), fk, dS)
        if dk is not None:
            dfk = torch.baddbmm(dz.unsqueeze(1), _rows(v, s, e, buf, "v"), dS.mT, out=buf("a", fk.shape))
            self.fm.grad(dfk, fk, aux, out=_slot(dk, s, e))


class _KernelSteps:
    """The same steps in the compiled CPU kernel (cpu_kernel.py): float32 / float64, elu and relu."""

    def __init__(self, kernel, feature_map: str, eps: float):
        self.kernel, self.map, self.eps = kernel, CPU_KERNEL_MAPS.index(feature_map), eps

    def state(self, k, v, s, e, buf):
        kc = _rows(k, s, e, buf, "k")
        return tuple(self.kernel.state_step(kc, _rows(v, s, e, buf, "v"), buf("f", kc.shape), self.map))

    def output(self, q, S, z, out, s, e, buf):
        qc = _rows(q, s, e, buf, "q")
        self.kernel.output_step(qc, S, z, self.eps, self.map, buf("f", qc.shape), buf("den", qc.shape[:2]),
                                _slot(out, s, e))

    def query_grad(self, q, dout, S, z, dq, s, e, buf):
        qc = _rows(q, s, e, buf, "q")
        return tuple(self.kernel.query_grad_step(
            qc, _rows(dout, s, e, buf, "do"), S, z, self.eps, self.map, buf("f", qc.shape),
            buf("g", qc.shape[:2] + S.shape[-1:]), buf("a", qc.shape), buf("den", qc.shape[:2]),
            None if dq is None else _slot(dq, s, e)))

    def key_value_grad(self, k, v, dS, dz, dk, dv, s, e, buf):
        kc = _rows(k, s, e, buf, "k")
        self.kernel.key_value_grad_step(kc, _rows(v, s, e, buf, "v"), dS, dz, self.map, buf("f", kc.shape),
                                        buf("a", kc.shape), None if dk is None else _slot(dk, s, e),
                                        None if dv is None else _slot(dv, s, e))


def _steps(q: torch.Tensor, feature_map: str, eps: float, use_kernel: Optional[bool]):
    """The compiled CPU steps where they serve the inputs (and ``use_kernel`` is not False), else torch ops."""
    kernel = cpu_kernel(q, feature_map) if use_kernel is not False else None
    if use_kernel and kernel is None:
        raise ValueError(f"the compiled CPU kernel cannot serve these inputs ({q.device.type}, {q.dtype}, "
                         f"feature_map={feature_map!r}; it takes float32/float64 CPU tensors and "
                         f"{list(CPU_KERNEL_MAPS)}, and needs VITZOO_CPU_KERNEL unset and a C++ compiler); "
                         "pass use_kernel=None to fall back to torch ops")
    return _KernelSteps(kernel, feature_map, eps) if kernel is not None else _TorchSteps(TORCH_FEATURE_MAPS[feature_map], eps)


def _forward(q, k, v, steps, chunk: int):
    S, z = _sweep(lambda s, e, buf: steps.state(k, v, s, e, buf), k.shape[2], chunk, k)
    out = v.new_empty(q.shape[:3] + v.shape[3:])
    _sweep(lambda s, e, buf: steps.output(q, S, z, out, s, e, buf), q.shape[2], chunk, q)
    return out, S, z


def _backward(dout, q, k, v, S, z, steps, chunk: int, needs):
    def new(x, wanted):
        return torch.empty_like(x, memory_format=torch.contiguous_format) if wanted else None

    dq, dk, dv = (new(x, wanted) for x, wanted in zip((q, k, v), needs))
    dS, dz = _sweep(lambda s, e, buf: steps.query_grad(q, dout, S, z, dq, s, e, buf), q.shape[2], chunk, q)
    if dk is not None or dv is not None:
        _sweep(lambda s, e, buf: steps.key_value_grad(k, v, dS, dz, dk, dv, s, e, buf), k.shape[2], chunk, k)
    return dq, dk, dv


class _LinearAttentionFn(FusedLinearFunction):
    """options: chunk, use_kernel."""

    @staticmethod
    def forward(q, k, v, feature_map: str, eps: float, chunk: int, use_kernel: Optional[bool]):
        with torch.autocast(q.device.type, enabled=False):  # fp32 sums whatever the caller's autocast
            return _forward(q, k, v, _steps(q, feature_map, eps, use_kernel), chunk)

    @staticmethod
    def fused_backward(ctx, dout, q, k, v, S, z, needs):
        chunk, use_kernel = ctx.options
        with torch.autocast(q.device.type, enabled=False):
            return _backward(dout, q, k, v, S, z, _steps(q, ctx.feature_map, ctx.eps, use_kernel), chunk, needs)


def linear_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, feature_map: str = "elu",
                           eps: float = 1e-6, chunk: Optional[int] = None,
                           use_kernel: Optional[bool] = None) -> torch.Tensor:
    """Chunked kernel attention on (B, H, N, D) tensors; ``chunk`` tokens per step (None = ~1 MiB buffers).

    ``use_kernel``: None runs the steps in the compiled CPU kernel where it serves the inputs (float32 /
    float64 CPU tensors, elu or relu) and in torch ops otherwise; True insists on the kernel, False on torch ops.
    """
    if feature_map not in TORCH_FEATURE_MAPS:
        raise ValueError(f"unknown feature_map {feature_map!r}; choose one of {sorted(TORCH_FEATURE_MAPS)}")
    if chunk is None:
        width = max(q.shape[-1] + TORCH_FEATURE_MAPS[feature_map].extra, v.shape[-1])
        chunk = chunk_tokens(q.shape[0] * q.shape[1], width, max(q.shape[2], k.shape[2]), q.device)
    elif chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens (or None for automatic), got {chunk}")
    return _LinearAttentionFn.apply(q, k, v, feature_map, eps, chunk, use_kernel)[0]
