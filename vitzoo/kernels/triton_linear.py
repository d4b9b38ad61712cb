"""Triton kernels for non-causal kernel attention (GPU; CI runs them under ``TRITON_INTERPRET=1``).

Forward: ``_state_kernel`` splits the token reduction S = sum_j phi(k_j)^T v_j, z = sum_j phi(k_j)
over (batch*heads, splits) programs and writes fp32 partials that are summed in a fixed order
(deterministic); ``_output_kernel`` computes phi(q) S / (phi(q).z + eps) with the division fused.
Backward (same notation as ``torch_linear``) recomputes the features: ``_dq_kernel`` reads q, dO
once, writes dq and partials of [dS | dz]; ``_dkv_kernel`` reads k, v once and writes dk, dv.
Only q, k, v, S, z are saved. Feature maps: elu (+1), relu and identity; q, k up to 256 features,
v up to 128 channels. A reduction with one split (short sequences, e.g. a ViT's few hundred tokens) takes
its one partial as the sum, with no second pass over fp32 partials. S, z and dS are made contiguous before a
kernel reads them (the kernels index them as dense (B*H, D, Dv) and (B*H, D) arrays).
Dots: IEEE fp32 for fp32 inputs; TF32 for bf16 (its truncation, ~1e-3, is below bf16's rounding); three-pass
TF32 for fp16, whose rounding (~5e-4) a TF32 truncation would approach.
Launches: batch*heads on grid axis 0 (CUDA caps axes 1 and 2 at 65,535), 64-bit token offsets,
autotuning keyed on a power-of-two bucket of the token count; the reductions' token block and warp
count are fixed, so S, z, dS, dz have the same bits in every process.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .availability import triton_interpreting
from .feature_maps import KERNEL_MAPS

__all__ = ["triton_forward", "triton_backward", "MAX_FEATURE_DIM", "MAX_HEAD_DIM"]

MAX_FEATURE_DIM = 256  # q, k: e.g. 256 precomputed random features
MAX_HEAD_DIM = 128  # v
REDUCE_BLOCK_N = 64  # token block of the reduction kernels: fixed, as it sets the summation order


def _block_configs():
    """Per-token-block kernels (output, dk/dv): no loop, so there is no pipelining depth to tune."""
    if triton_interpreting():  # one config: the interpreter is slow and has nothing to tune
        return [triton.Config({"BLOCK_N": 32}, num_warps=4)]
    return [triton.Config({"BLOCK_N": bn}, num_warps=w) for bn in (64, 128) for w in (4, 8)]


def _reduce_configs():
    """Reduction kernels (state, dq): BLOCK_N and num_warps come from the launch; only the pipelining
    depth, which leaves the arithmetic unchanged, is tuned."""
    return [triton.Config({}, num_warps=None, num_stages=s) for s in ((2,) if triton_interpreting() else (2, 3, 4))]


_KEY = ["N_BUCKET", "D", "DV"]  # N_BUCKET = _pow2(N), unused in the kernels: one tuning per bucket


@triton.jit
def _phi(x, FEATURE: tl.constexpr):
    if FEATURE == 0:
        return tl.where(x > 0, x + 1.0, tl.exp(tl.minimum(x, 0.0)))
    if FEATURE == 1:
        return tl.maximum(x, 0.0)
    return x


@triton.jit
def _dphi(x, FEATURE: tl.constexpr):
    if FEATURE == 0:
        return tl.where(x > 0, 1.0, tl.exp(tl.minimum(x, 0.0)))
    if FEATURE == 1:
        return tl.where(x > 0, 1.0, 0.0)
    return tl.full(x.shape, 1.0, tl.float32)


@triton.jit
def _ptrs(ptr, stride_n, stride_d, offs_n, offs_d):
    """Pointers of a (tokens, dims) tile; 64-bit token offsets (n * stride_n passes 2^31 at ~1M packed-qkv tokens)."""
    return ptr + (offs_n.to(tl.int64)[:, None] * stride_n + offs_d[None, :] * stride_d)


@triton.jit
def _tile(ptr, stride_n, stride_d, offs_n, offs_d, mask):
    return tl.load(_ptrs(ptr, stride_n, stride_d, offs_n, offs_d), mask=mask, other=0.0)


@triton.jit
def _block_ids(N, BLOCK_N: tl.constexpr):
    """(batch*head, token block) of a program on the flat grid of ``_block_grid``."""
    pid, blocks = tl.program_id(0), tl.cdiv(N, BLOCK_N)
    return (pid // blocks).to(tl.int64), pid % blocks


@triton.autotune(configs=_reduce_configs(), key=_KEY)
@triton.jit
def _state_kernel(
    K,
    V,
    PS,
    PZ,
    N,
    N_BUCKET,
    H,
    per_split,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    FEATURE: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh, split, splits = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(1)
    b, h = bh // H, bh % H
    K += b * skb + h * skh
    V += b * svb + h * svh
    offs_d, offs_e = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, N)
    acc_s = tl.zeros((BLOCK_D, BLOCK_DV), dtype=tl.float32)
    acc_z = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        rows = offs_n < hi
        mk = rows[:, None] & (offs_d[None, :] < D)
        fk = tl.where(mk, _phi(_tile(K, skn, skd, offs_n, offs_d, mk).to(tl.float32), FEATURE), 0.0)
        v = _tile(V, svn, svd, offs_n, offs_e, rows[:, None] & (offs_e[None, :] < DV)).to(tl.float32)
        acc_s += tl.dot(tl.trans(fk), v, input_precision=PREC)
        acc_z += tl.sum(fk, axis=0)
    part = bh * splits + split
    tl.store(
        PS + part * D * DV + offs_d[:, None] * DV + offs_e[None, :],
        acc_s,
        mask=(offs_d[:, None] < D) & (offs_e[None, :] < DV),
    )
    tl.store(PZ + part * D + offs_d, acc_z, mask=offs_d < D)


@triton.autotune(configs=_block_configs(), key=_KEY)
@triton.jit
def _output_kernel(
    Q,
    S,
    Z,
    O,  # noqa: E741 (the output pointer, named as Q, S and Z are)
    N,
    N_BUCKET,
    H,
    eps,
    sqb,
    sqh,
    sqn,
    sqd,
    sob,
    soh,
    son,
    sod,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    FEATURE: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh, blk = _block_ids(N, BLOCK_N)
    b, h = bh // H, bh % H
    offs_n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, offs_e = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    md, me, rows = offs_d < D, offs_e < DV, offs_n < N
    s = tl.load(S + bh * D * DV + offs_d[:, None] * DV + offs_e[None, :], mask=md[:, None] & me[None, :], other=0.0)
    z = tl.load(Z + bh * D + offs_d, mask=md, other=0.0)
    mq = rows[:, None] & md[None, :]
    fq = tl.where(mq, _phi(_tile(Q + b * sqb + h * sqh, sqn, sqd, offs_n, offs_d, mq).to(tl.float32), FEATURE), 0.0)
    den = tl.sum(fq * z[None, :], axis=1) + eps
    out = tl.dot(fq, s, input_precision=PREC) / den[:, None]
    tl.store(
        _ptrs(O + b * sob + h * soh, son, sod, offs_n, offs_e),
        out.to(O.dtype.element_ty),
        mask=rows[:, None] & me[None, :],
    )


@triton.autotune(configs=_reduce_configs(), key=_KEY)
@triton.jit
def _dq_kernel(
    Q,
    DO,
    S,
    Z,
    DQ,
    PS,
    PZ,
    N,
    N_BUCKET,
    H,
    per_split,
    eps,
    sqb,
    sqh,
    sqn,
    sqd,
    sob,
    soh,
    son,
    sod,
    sgb,
    sgh,
    sgn,
    sgd,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    FEATURE: tl.constexpr,
    PREC: tl.constexpr,
    NEED_DQ: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh, split, splits = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.num_programs(1)
    b, h = bh // H, bh % H
    offs_d, offs_e = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    md, me = offs_d < D, offs_e < DV
    s = tl.load(S + bh * D * DV + offs_d[:, None] * DV + offs_e[None, :], mask=md[:, None] & me[None, :], other=0.0)
    z = tl.load(Z + bh * D + offs_d, mask=md, other=0.0)
    Q += b * sqb + h * sqh
    DO += b * sob + h * soh
    DQ += b * sgb + h * sgh
    lo = split * per_split
    hi = tl.minimum(lo + per_split, N)
    acc_s = tl.zeros((BLOCK_D, BLOCK_DV), dtype=tl.float32)
    acc_z = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        rows = offs_n < hi
        mq = rows[:, None] & md[None, :]
        q = _tile(Q, sqn, sqd, offs_n, offs_d, mq).to(tl.float32)
        fq = tl.where(mq, _phi(q, FEATURE), 0.0)
        do = _tile(DO, son, sod, offs_n, offs_e, rows[:, None] & me[None, :]).to(tl.float32)
        den = tl.sum(fq * z[None, :], axis=1) + eps
        g = do / den[:, None]
        a = tl.dot(g, tl.trans(s), input_precision=PREC)
        w = tl.sum(fq * a, axis=1) / den
        acc_s += tl.dot(tl.trans(fq), g, input_precision=PREC)
        acc_z -= tl.sum(fq * w[:, None], axis=0)
        if NEED_DQ:
            dq = (a - w[:, None] * z[None, :]) * _dphi(q, FEATURE)
            tl.store(_ptrs(DQ, sgn, sgd, offs_n, offs_d), dq.to(DQ.dtype.element_ty), mask=mq)
    part = bh * splits + split
    tl.store(PS + part * D * DV + offs_d[:, None] * DV + offs_e[None, :], acc_s, mask=md[:, None] & me[None, :])
    tl.store(PZ + part * D + offs_d, acc_z, mask=md)


@triton.autotune(configs=_block_configs(), key=_KEY)
@triton.jit
def _dkv_kernel(
    K,
    V,
    DS,
    DZ,
    DK,
    DV_,
    N,
    N_BUCKET,
    H,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sgb,
    sgh,
    sgn,
    sgd,
    swb,
    swh,
    swn,
    swd,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    FEATURE: tl.constexpr,
    PREC: tl.constexpr,
    NEED_DK: tl.constexpr,
    NEED_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh, blk = _block_ids(N, BLOCK_N)
    b, h = bh // H, bh % H
    offs_n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, offs_e = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    md, me, rows = offs_d < D, offs_e < DV, offs_n < N
    ds = tl.load(DS + bh * D * DV + offs_d[:, None] * DV + offs_e[None, :], mask=md[:, None] & me[None, :], other=0.0)
    mk, mv = rows[:, None] & md[None, :], rows[:, None] & me[None, :]
    k = _tile(K + b * skb + h * skh, skn, skd, offs_n, offs_d, mk).to(tl.float32)
    if NEED_DV:
        fk = tl.where(mk, _phi(k, FEATURE), 0.0)
        dv = tl.dot(fk, ds, input_precision=PREC)
        tl.store(_ptrs(DV_ + b * swb + h * swh, swn, swd, offs_n, offs_e), dv.to(DV_.dtype.element_ty), mask=mv)
    if NEED_DK:
        dz = tl.load(DZ + bh * D + offs_d, mask=md, other=0.0)
        v = _tile(V + b * svb + h * svh, svn, svd, offs_n, offs_e, mv).to(tl.float32)
        dk = (tl.dot(v, tl.trans(ds), input_precision=PREC) + dz[None, :]) * _dphi(k, FEATURE)
        tl.store(_ptrs(DK + b * sgb + h * sgh, sgn, sgd, offs_n, offs_d), dk.to(DK.dtype.element_ty), mask=mk)


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _block_grid(bh: int, n: int):
    """Flat grid of the per-token-block kernels: B*H x blocks on axis 0 (CUDA allows 2^31 - 1 there)."""
    return lambda meta: (bh * triton.cdiv(n, meta["BLOCK_N"]),)


def _split(bh: int, n: int, sms: int | None):
    """(splits, tokens per split, a multiple of REDUCE_BLOCK_N) of the reductions' grid (B*H, splits).

    With ``sms`` (the GPU's SM count): up to ~4 programs per SM; without (interpreter): up to 4 splits of
    >= one block, so that the partial sums are exercised.
    """
    # >= 512 tokens a split: partials ~1/8 of the bf16 k, v read (D=Dv=64); idle SMs (of 132) only if B*H*n < 64k
    target, min_tokens = (4 * sms, 512) if sms else (4 * bh, REDUCE_BLOCK_N)
    splits = max(1, min(triton.cdiv(n, min_tokens), triton.cdiv(target, bh)))
    per_split = triton.cdiv(triton.cdiv(n, splits), REDUCE_BLOCK_N) * REDUCE_BLOCK_N
    return triton.cdiv(n, per_split), per_split


def _sms(device: torch.device):
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None


def _partials(bh: int, splits: int, d: int, dv: int, device):
    return (
        torch.empty(bh, splits, d, dv, device=device, dtype=torch.float32),
        torch.empty(bh, splits, d, device=device, dtype=torch.float32),
    )


DOT_PRECISION = {torch.float32: "ieee", torch.bfloat16: "tf32", torch.float16: "tf32x3"}  # fp32 operands either way


def _meta(q, v, feature_map: str):
    d, dv = q.shape[-1], v.shape[-1]
    return dict(
        D=d, DV=dv, BLOCK_D=_pow2(d), BLOCK_DV=_pow2(dv), FEATURE=KERNEL_MAPS[feature_map], PREC=DOT_PRECISION[q.dtype]
    )


def _reduced(ps: torch.Tensor, pz: torch.Tensor):
    """The sum over the splits of (B*H, splits, D, Dv) and (B*H, splits, D) partials, in a fixed order; one split
    is its own sum (a view, no pass over the partials)."""
    if ps.shape[1] == 1:
        return ps[:, 0], pz[:, 0]
    return ps.sum(1), pz.sum(1)


def _reduce_meta(meta):
    """The reductions' fixed launch: the token block; 8 warps above 32x32 state tiles (4 spill in dq on sm_90)."""
    return dict(BLOCK_N=REDUCE_BLOCK_N, num_warps=4 if meta["BLOCK_D"] * meta["BLOCK_DV"] <= 32 * 32 else 8)


def _forward(q, k, v, feature_map: str, eps: float):
    (B, H, N, d), nk = q.shape, k.shape[2]
    meta = _meta(q, v, feature_map)
    splits, per_split = _split(B * H, nk, _sms(q.device))
    ps, pz = _partials(B * H, splits, d, v.shape[-1], q.device)
    _state_kernel[(B * H, splits)](
        k, v, ps, pz, nk, _pow2(nk), H, per_split, *k.stride(), *v.stride(), **meta, **_reduce_meta(meta)
    )
    S, z = _reduced(ps, pz)  # fixed-order sum of the partials: deterministic
    out = torch.empty(B, H, N, v.shape[-1], device=q.device, dtype=v.dtype)
    _output_kernel[_block_grid(B * H, N)](q, S, z, out, N, _pow2(N), H, eps, *q.stride(), *out.stride(), **meta)
    return out, S, z


def _backward(dout, q, k, v, S, z, feature_map: str, eps: float, needs):
    (B, H, N, d), nk = q.shape, k.shape[2]
    meta = _meta(q, v, feature_map)
    S, z = S.contiguous(), z.contiguous()  # saved state may come back strided (a compiler's or vmap's copy)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format) if needs[0] else q  # else never written
    splits, per_split = _split(B * H, N, _sms(q.device))
    ps, pz = _partials(B * H, splits, d, v.shape[-1], q.device)
    _dq_kernel[(B * H, splits)](
        q,
        dout,
        S,
        z,
        dq,
        ps,
        pz,
        N,
        _pow2(N),
        H,
        per_split,
        eps,
        *q.stride(),
        *dout.stride(),
        *dq.stride(),
        NEED_DQ=needs[0],
        **meta,
        **_reduce_meta(meta),
    )
    dS, dz = _reduced(ps, pz)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format) if needs[1] else k  # else never written
    dv = torch.empty_like(v, memory_format=torch.contiguous_format) if needs[2] else v
    if needs[1] or needs[2]:
        _dkv_kernel[_block_grid(B * H, nk)](
            k,
            v,
            dS,
            dz,
            dk,
            dv,
            nk,
            _pow2(nk),
            H,
            *k.stride(),
            *v.stride(),
            *dk.stride(),
            *dv.stride(),
            NEED_DK=needs[1],
            NEED_DV=needs[2],
            **meta,
        )
    return (dq if needs[0] else None, dk if needs[1] else None, dv if needs[2] else None)


def _on_device_of(x: torch.Tensor):
    """Launches go to the current CUDA device: make it x's (tensors on cuda:1 while cuda:0 is current)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def triton_forward(q, k, v, feature_map: str, eps: float):
    """(out, S, z): the forward of ``ops.linear_attention_op`` on this path."""
    with _on_device_of(q):
        return _forward(q, k, v, feature_map, eps)


def triton_backward(dout, q, k, v, S, z, feature_map: str, eps: float, needs):
    """(dq, dk, dv) (None where not ``needs``), contiguous."""
    with _on_device_of(q):
        return _backward(dout, q, k, v, S, z, feature_map, eps, needs)
