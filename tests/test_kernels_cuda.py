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
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not (torch.cuda.is_available() and triton_available()), reason="needs a CUDA GPU and triton"),
]
EPS = 1e-6
# Norm-wise relative error allowed: fp32 runs IEEE dots; bf16/fp16 inputs are read into fp32 and multiplied
# as TF32 (10-bit mantissa), with fp32 state and normaliser, so the output's own rounding dominates.
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
GRAD_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def make_inputs(b, h, n, d, dv, dtype, layout="bhnd", std=1.0, seed=0, features=False):
    """q, k, v on the device: contiguous (B, H, N, D), or views of timm's packed (B, N, 3, H, D) qkv; ``features``:
    q, k positive, exp of a Gaussian over sqrt(d) (precomputed features, such as Performer's, for ``identity``)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    if layout == "packed":
        qkv = std * torch.randn(b, n, 3, h, d, generator=g, device=DEVICE)
        return qkv.to(dtype).permute(2, 0, 3, 1, 4).unbind(0)
    q, k, v = [std * torch.randn(b, h, n, w, generator=g, device=DEVICE) for w in (d, d, dv)]
    if features:
        q, k = (x.exp() / d**0.5 for x in (q, k))
    return [x.to(dtype) for x in (q, k, v)]


def check(b, h, n, d, dv, dtype, feature_map="elu", layout="bhnd", std=1.0):
    q, k, v = (
        t.detach().requires_grad_(True)
        for t in make_inputs(b, h, n, d, dv, dtype, layout, std, features=feature_map == "identity")
    )
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


def test_256_features_and_64_value_channels_in_fp32():
    """Performer's default (256 random features, identity map) in fp32: the largest state tile, 256 x 64, held in
    registers by the dq kernel; an autotune set whose every config runs out of resources raises here."""
    check(2, 2, 4096, 256, 64, torch.float32, feature_map="identity")


KERNELS = ("_state_kernel", "_output_kernel", "_dq_kernel", "_dkv_kernel")


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_autotune_config(kernel, monkeypatch):
    """Each config of each kernel's autotune set on its own (the interpreter runs one; the tuner may pick any)."""
    from vitzoo.kernels import triton_linear

    tuner = getattr(triton_linear, kernel)
    for config in list(tuner.configs):
        monkeypatch.setattr(tuner, "configs", [config])  # one config: the tuner runs it without benchmarking
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            check(2, 2, 1000, 64, 64, dtype)
        check(1, 2, 1000, 256, 64, torch.float32, feature_map="identity")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("feature_map", ["elu", "relu"])
def test_half_inputs_at_16384_tokens(dtype, feature_map):
    """bf16 / fp16 inputs at the benchmark's size: TF32 (bf16) and three-pass TF32 (fp16) dots within the output's
    rounding of float64."""
    check(2, 4, 16384, 64, 64, DTYPES[dtype], feature_map=feature_map)


def test_vit_sized_sequences_take_one_split_and_keep_the_state_dense():
    """197 tokens (a ViT at 224 px, patch 16): one split on any GPU, the partial is the state (no second pass);
    a saved state handed back strided gives the same gradients."""
    from vitzoo.kernels.triton_linear import _sms, _split, triton_backward, triton_forward

    assert _split(8 * 3, 197, _sms(DEVICE))[0] == 1
    check(8, 3, 197, 64, 64, torch.bfloat16)
    q, k, v = make_inputs(8, 3, 197, 64, 64, torch.bfloat16)
    out, S, z = triton_forward(q, k, v, "elu", EPS)
    assert S.is_contiguous() and z.is_contiguous() and S.dtype == torch.float32
    dout = torch.randn_like(out)
    dense = triton_backward(dout, q, k, v, S, z, "elu", EPS, [True] * 3)
    strided = (S.transpose(1, 2).contiguous().transpose(1, 2), torch.stack([z, z], -1)[..., 0])
    assert all(map(torch.equal, dense, triton_backward(dout, q, k, v, *strided, "elu", EPS, [True] * 3)))


def _eager(model):
    for m in model.modules():
        if hasattr(m, "impl"):
            m.impl = "eager"
    return model


@pytest.mark.parametrize("preset", [{"name": "linear", "feature_map": "elu"}, {"name": "performer"}])
def test_vit_under_bf16_autocast_matches_its_eager_twin(preset):
    """A ViT's forward and backward under bf16 autocast on the Triton path against the eager formula: elu+1 on
    bf16 q, k; Performer's fp32 features (autocast leaves the custom op's fp32 inputs fp32: IEEE dots)."""
    import copy

    import vitzoo

    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", attention=preset, num_classes=10).to(DEVICE)
    twin = _eager(copy.deepcopy(model))
    x = torch.randn(4, 3, 32, 32, device=DEVICE)
    outs = []
    for net in (model, twin):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(x)
        logits.float().square().mean().backward()
        outs.append((logits.float(), net.patch_embed.proj.weight.grad))
    # autocast runs the eager formula's matmuls in bf16, the kernels' dots in TF32: both round, differently
    assert rel_err(outs[0][0], outs[1][0].double()) <= 5e-2
    assert rel_err(outs[0][1], outs[1][1].double()) <= 1e-1


def test_compiled_vit_linear_matches_eager():
    """torch.compile of vit_linear (the fused op seen as one node) gives the eager module's logits."""
    import vitzoo

    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", attention="linear", num_classes=10).to(DEVICE).eval()
    x = torch.randn(8, 3, 32, 32, device=DEVICE)
    with torch.no_grad():
        eager, compiled = model(x), torch.compile(model)(x)
    assert rel_err(compiled, eager.double()) <= 1e-4
