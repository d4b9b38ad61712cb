"""The Triton linear-attention kernels on a CUDA device, forward and backward, against float64 (``pytest -m cuda``).

Skipped where no GPU is visible (CI). The reference is the formula itself in float64 on the kernels' own
(rounded) inputs, in its linear-time form, so 65,536 tokens fit: out = phi(q) S / (phi(q).z + eps) with
S = sum_j phi(k_j)^T v_j and z = sum_j phi(k_j). Errors are norm-wise, relative to the reference.
"""
from __future__ import annotations

import pytest
import torch

from attention_reference import kernel_ref_linear_time
from vitzoo.kernels import fused_linear_attention, triton_available

DEVICE = torch.device("cuda")
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()),
                                                   reason="needs a CUDA GPU and triton")]
EPS = 1e-6
# Norm-wise relative error allowed: fp32 runs IEEE dots; bf16/fp16 inputs are read into fp32 and multiplied
# as TF32 (10-bit mantissa), with fp32 state and normaliser, so the output's own rounding dominates.
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
GRAD_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def make_inputs(b, h, n, d, dv, dtype, layout="bhnd", std=1.0, seed=0):
    """q, k, v on the device: contiguous (B, H, N, D), or views of timm's packed (B, N, 3, H, D) qkv."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    if layout == "packed":
        qkv = std * torch.randn(b, n, 3, h, d, generator=g, device=DEVICE)
        return qkv.to(dtype).permute(2, 0, 3, 1, 4).unbind(0)
    return [(std * torch.randn(b, h, n, w, generator=g, device=DEVICE)).to(dtype) for w in (d, d, dv)]


def check(b, h, n, d, dv, dtype, feature_map="elu", layout="bhnd", std=1.0):
    q, k, v = (t.detach().requires_grad_(True) for t in make_inputs(b, h, n, d, dv, dtype, layout, std))
    out = fused_linear_attention(q, k, v, feature_map, impl="triton")
    assert out.dtype == dtype and out.shape == (b, h, n, dv) and torch.isfinite(out).all()
    refs = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = kernel_ref_linear_time(*refs, feature_map, EPS)
    assert rel_err(out, ref) <= TOL[dtype], rel_err(out, ref)
    dout = torch.randn(out.shape, generator=torch.Generator(device=DEVICE).manual_seed(1), device=DEVICE)
    grads = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    ref_grads = torch.autograd.grad(ref, refs, dout.to(dtype).double())
    for name, grad, ref_grad in zip("qkv", grads, ref_grads):
        assert grad.dtype == dtype and torch.isfinite(grad).all(), name
        if n > 1 or name == "v":  # one token: dq and dk are ~0 (every weight is 1), nothing relative to check
            assert rel_err(grad, ref_grad) <= GRAD_TOL[dtype], (name, rel_err(grad, ref_grad))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [16, 32, 64, 128])
def test_every_dtype_and_head_dim_at_4096_tokens(dtype, d):
    check(2, 2, 4096, d, d, DTYPES[dtype])


@pytest.mark.parametrize("n", [1, 17, 65_536])
def test_token_counts(n):
    check(1, 2, n, 64, 64, torch.bfloat16)


@pytest.mark.parametrize("dtype,d,dv,n", [("fp16", 64, 32, 17), ("fp32", 32, 128, 4096), ("bf16", 128, 16, 4096)])
def test_value_dim_other_than_head_dim(dtype, d, dv, n):
    check(2, 3, n, d, dv, DTYPES[dtype])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_qkv_strided_views(dtype):
    check(2, 3, 4096, 64, 64, DTYPES[dtype], layout="packed")


def test_relu_feature_map():
    check(2, 2, 4096, 64, 64, torch.bfloat16, feature_map="relu")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_at_65536_tokens_with_inputs_of_std_3(dtype):
    """The state sums 65,536 products of features up to ~13 with values up to ~15: far past fp16's 65,504.
    fp32 accumulation of the state and normaliser keeps it finite and within the output's rounding."""
    check(1, 2, 65_536, 64, 64, DTYPES[dtype], std=3.0)
