"""Chunked torch path for non-causal kernel attention, with the analytic backward (behind ops.py's custom op).

out_i = phi(q_i) S / (phi(q_i).z + eps),  S = sum_j phi(k_j)^T v_j,  z = sum_j phi(k_j).

Forward and backward walk over the tokens in chunks, so the working set is a few cache-sized
fp32 buffers whatever n is; only q, k, v, S and z are saved (features are recomputed). With
g = dO / den, a = g S^T and w = (phi(q).a) / den the gradients are

    dphi(q) = a - w z^T,   dS = sum_i phi(q_i)^T g_i,   dz = -sum_i w_i phi(q_i),
    dphi(k) = v dS^T + dz,  dv = phi(k) dS,

i.e. six (chunk x d x d) matmuls in all and one read of q, k, v, dO. Sums run in fp32 for any
input dtype; outputs and gradients come back in the inputs' dtypes.

Two step sets run a forward and a backward: ``_KernelSteps``, the compiled CPU kernel (cpu_kernel.py;
one call per forward or backward, threaded inside it, in blocks of 256 rows per (batch, head) slice that
stay in L2, the feature map and the element-wise work fused into row loops, the products in AVX-512 or
AVX2 register tiles, else MKL; float32 / float64 CPU tensors, elu, relu and identity), or ``_TorchSteps`` in
torch ops, four sweeps (state, output, query grads, key/value grads) over token ranges, in chunks of all
slices at once (any device, dtype and feature map; the reference the kernel is tested against).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Dict, Optional

import torch

from ._threads import single_threaded_pool
from .cpu_kernel import cpu_kernel
from .dtypes import sum_dtype
from .feature_maps import FUSED_MAPS, KERNEL_MAPS, FusedMap

__all__ = ["torch_forward", "torch_backward", "check_inputs", "chunk_tokens"]

_CHUNK_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 24}  # per (batch*heads, chunk, features) buffer
_MIN_WORKER_TOKENS = 8  # fewer tokens per thread go to one worker ...
_MIN_PARALLEL_ELEMENTS = 1 << 16  # ... and so do inputs this small (a hand-over costs ~0.1-0.3 ms)
_KERNEL_BLOCK_ROWS = 256  # rows per slice and block of the CPU kernel: its (block, d) buffers stay in L2
_OMP_SLICES_PER_THREAD = 8  # batch*heads >= this many per thread: torch's intra-op threads instead


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
        self.dtype, self.device = dtype, device
        self.cache: Dict[str, torch.Tensor] = {}

    def __call__(self, name: str, shape) -> torch.Tensor:
        numel = math.prod(shape)
        flat = self.cache.get(name)
        if flat is None or flat.numel() < numel:
            flat = self.cache[name] = torch.empty(numel, dtype=self.dtype, device=self.device)
        return flat[:numel].view(shape)


def _rows(x: torch.Tensor, s: int, e: int, buf: _Scratch, name: str) -> torch.Tensor:
    """Tokens s:e of a (B, H, N, D) tensor as (B*H, e-s, D) in ``sum_dtype`` with contiguous
    rows: a view when the layout and dtype allow, else a copy into scratch."""
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


def _threads(like: torch.Tensor, n: int) -> int:
    """Threads for a pass over n tokens of ``like``'s slices: torch's intra-op count, one for tiny inputs."""
    threads = torch.get_num_threads() if like.device.type == "cpu" else 1
    if threads <= 1 or like.shape[0] * like.shape[1] >= _OMP_SLICES_PER_THREAD * threads:
        return threads
    return min(threads, n // _MIN_WORKER_TOKENS) if like.numel() >= _MIN_PARALLEL_ELEMENTS else 1


def _sweep(walk, n: int, like: torch.Tensor):
    """Sum of ``walk(lo, hi)`` (a tuple of tensors, or None) over a split of range(n) (walks may also
    write outputs).

    On CPU with few (batch x heads) slices the tokens are cut into one contiguous range per
    intra-op thread (one range for tiny inputs), each walked on a single-threaded worker: an
    OpenMP barrier per op costs more than the op here, and far more on a shared CPU. With many
    slices (a training batch) one range is walked on the calling thread and torch's own threads
    split the work over the slices; workers there would compete with the idle-spinning OpenMP
    threads of the surrounding model. Partial sums are added in a fixed order, so the result is
    deterministic for a given thread count.
    """
    workers = _threads(like, n)
    if workers <= 1 or like.shape[0] * like.shape[1] >= _OMP_SLICES_PER_THREAD * workers:
        return walk(0, n)
    ranges = _spans(0, n, -(-n // workers))
    return _total(single_threaded_pool(len(ranges)).map(lambda lo_hi: walk(*lo_hi), ranges))


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


def _chunked(step):
    """A per-chunk step ``(self, *tensors, s, e, buf)`` as a per-range one ``(self, *tensors, lo, hi)``:
    chunks of ``self.chunk`` tokens sharing one scratch, their partial sums added in order."""

    def walk(self, *args):
        *tensors, lo, hi = args
        buf = _Scratch(sum_dtype(tensors[0].dtype), tensors[0].device)
        return _total(step(self, *tensors, s, e, buf) for s, e in _spans(lo, hi, self.chunk))

    return walk


class _TorchSteps:
    """The steps in torch ops (any device and dtype, every feature map), tokens in chunks of
    ``chunk`` for all slices at once (None: ~1 MiB buffers, see ``chunk_tokens``)."""

    def __init__(
        self, fm: FusedMap, eps: float, chunk: Optional[int], q: torch.Tensor, v: torch.Tensor, num_tokens: int
    ):
        self.fm, self.eps = fm, eps
        width = max(q.shape[-1] + fm.extra, v.shape[-1])
        self.chunk = chunk or chunk_tokens(q.shape[0] * q.shape[1], width, num_tokens, q.device)

    def forward(self, q, k, v):
        S, z = _sweep(lambda lo, hi: self.state(k, v, lo, hi), k.shape[2], k)
        out = v.new_empty(q.shape[:3] + v.shape[3:])
        _sweep(lambda lo, hi: self.output(q, S, z, out, lo, hi), q.shape[2], q)
        return out, S, z

    def backward(self, dout, q, k, v, S, z, dq, dk, dv):
        dS, dz = _sweep(lambda lo, hi: self.query_grad(q, dout, S, z, dq, lo, hi), q.shape[2], q)
        if dk is not None or dv is not None:
            _sweep(lambda lo, hi: self.key_value_grad(k, v, dS, dz, dk, dv, lo, hi), k.shape[2], k)

    @_chunked
    def state(self, k, v, s, e, buf):
        """This chunk's S = phi(k)^T v (BH, F, Dv) and z = sum phi(k) (BH, F): separate products, as
        an (F x Dv+1) one costs as much as (F x Dv+16) here."""
        fk, _ = self.fm.phi(_rows(k, s, e, buf, "k"), buf)
        return torch.bmm(fk.mT, _rows(v, s, e, buf, "v")), fk.sum(1)

    @_chunked
    def output(self, q, S, z, out, s, e, buf):
        fq, _ = self.fm.phi(_rows(q, s, e, buf, "q"), buf)
        num = torch.bmm(fq, S, out=buf("num", fq.shape[:2] + S.shape[-1:]))
        den = _rowdot(fq, z.unsqueeze(1), buf).add_(self.eps).unsqueeze(-1)
        torch.div(num, den, out=_slot(out, s, e))

    @_chunked
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

    @_chunked
    def key_value_grad(self, k, v, dS, dz, dk, dv, s, e, buf):
        fk, aux = self.fm.phi(_rows(k, s, e, buf, "k"), buf)
        if dv is not None:
            _bmm_into(_slot(dv, s, e), fk, dS)
        if dk is not None:
            dfk = torch.baddbmm(dz.unsqueeze(1), _rows(v, s, e, buf, "v"), dS.mT, out=buf("a", fk.shape))
            self.fm.grad(dfk, fk, aux, out=_slot(dk, s, e))


def _unit_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in ``dtype`` with unit column stride and rows that do not overlap (the kernel's layout): a
    strided view such as timm's packed qkv stays as it is; anything else (an expanded gradient) is copied."""
    rows_ok = x.shape[-1] <= 1 or x.stride(-1) == 1
    if x.dtype == dtype and rows_ok and (x.shape[2] <= 1 or x.stride(2) >= x.shape[-1]):
        return x
    return x.to(dtype).contiguous()


class _KernelSteps:
    """The forward and backward as calls of the compiled CPU kernel (cpu_kernel.py), each walking every slice in
    blocks of ``block`` rows on ``_threads`` threads; float32 / float64, the maps of ``KERNEL_MAPS``."""

    def __init__(self, kernel, feature_map: str, eps: float, block: Optional[int], dtype: torch.dtype):
        self.kernel, self.map, self.eps = kernel, KERNEL_MAPS[feature_map], eps
        self.block, self.dtype = block or _KERNEL_BLOCK_ROWS, dtype

    def _rows(self, *tensors):
        return tuple(_unit_rows(t, self.dtype) for t in tensors)

    def _threads(self, q, k) -> int:
        return max(_threads(q, q.shape[2]), _threads(k, k.shape[2]))

    def forward(self, q, k, v):
        q, k, v = self._rows(q, k, v)
        return tuple(self.kernel.forward(q, k, v, self.map, self.eps, self.block, self._threads(q, k)))

    def backward(self, dout, q, k, v, S, z, dq, dk, dv):
        q, k, v, dout = self._rows(q, k, v, dout)
        self.kernel.backward(dout, q, k, v, S, z, self.map, self.eps, dq, dk, dv, self.block, self._threads(q, k))


def _steps(q, k, v, feature_map: str, eps: float, chunk: Optional[int], use_kernel: Optional[bool]):
    """The compiled CPU sweeps where they serve the inputs (and ``use_kernel`` is not False), else torch ops."""
    kernel = cpu_kernel(q, feature_map) if use_kernel is not False else None
    if use_kernel and kernel is None:
        raise ValueError(
            f"the compiled CPU kernel cannot serve these inputs ({q.device.type}, {q.dtype}, "
            f"feature_map={feature_map!r}; it takes float32/float64 CPU tensors and "
            f"{sorted(KERNEL_MAPS)}, and needs VITZOO_CPU_KERNEL unset and a C++ compiler); "
            "pass use_kernel=None to fall back to torch ops"
        )
    if kernel is not None:
        return _KernelSteps(kernel, feature_map, eps, chunk, q.dtype)
    return _TorchSteps(FUSED_MAPS[feature_map], eps, chunk, q, v, max(q.shape[2], k.shape[2]))


def _backward(dout, q, k, v, S, z, steps, needs):
    def new(x, wanted):
        return torch.empty_like(x, memory_format=torch.contiguous_format) if wanted else None

    dq, dk, dv = (new(x, wanted) for x, wanted in zip((q, k, v), needs))
    steps.backward(dout, q, k, v, S, z, dq, dk, dv)
    return dq, dk, dv


def _no_autocast(x: torch.Tensor):
    """A context with autocast off on x's device (none to enter where it is off already: ~7 us a call)."""
    return torch.autocast(x.device.type, enabled=False) if torch.is_autocast_enabled(x.device.type) else nullcontext()


def torch_forward(q, k, v, feature_map: str, eps: float, chunk: Optional[int], use_kernel: Optional[bool]):
    """(out, S, z): the forward of ``ops.linear_attention_op`` on this path."""
    with _no_autocast(q):  # fp32 sums whatever the caller's autocast
        return _steps(q, k, v, feature_map, eps, chunk, use_kernel).forward(q, k, v)


def torch_backward(
    dout, q, k, v, S, z, feature_map: str, eps: float, chunk: Optional[int], use_kernel: Optional[bool], needs
):
    """(dq, dk, dv) (None where not ``needs``): the analytic backward of this path."""
    with _no_autocast(q):
        return _backward(dout, q, k, v, S, z, _steps(q, k, v, feature_map, eps, chunk, use_kernel), needs)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """(B, H, N, D) q, k and (B, H, N, Dv) v on one device in one floating dtype, else a ValueError naming the fix."""
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise ValueError(
            f"q, k, v must be (B, H, N, D) tensors, got shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}; reshape to (batch, heads, tokens, head_dim)"
        )
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; q and k "
            "need the same (B, H, *, D), k and v the same (B, H, N, *)"
        )
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}; move them with .to()")
    if not (q.is_floating_point() and q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast them first")
