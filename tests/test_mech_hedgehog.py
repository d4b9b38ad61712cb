"""Hedgehog's feature map on linear attention: float64 formula, the fused path against eager (values and
gradients in W and b), initialisation, both backbones at twice the resolution, bad options."""

import pytest
import torch

from vitzoo.attention.hedgehog import HedgehogFeatureMap, hedgehog_features

from attention_reference import kernel_ref, module_out, module_qkv, single_thread, softmax_rows  # noqa: F401
from mech_checks import assert_one_line_error, build, check_double_resolution, gradcheck_module


def spec(num_features=8, **options):
    return {"name": "linear", "feature_map": {"name": "hedgehog", "num_features": num_features}, **options}


def phi_ref(x, w, b):
    """phi(x) = softmax([x W + b, -(x W + b)]) per head, written out: e / sum(e), e = exp([u, -u])."""
    u = x.double() @ w.double() + b.double()
    return softmax_rows(torch.cat([u, -u], dim=-1))


def hedgehog_ref(q, k, v, w, b):
    """out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) and the matrix A."""
    return kernel_ref(q, k, v, lambda x: phi_ref(x, w, b), eps=0.0)


def randomise(attn, seed=1):
    """W and b away from their initialisation (the identity would hide a transposed W)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (attn.phi.weight, attn.phi.bias):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return attn


@pytest.mark.parametrize("impl", ["auto", "eager"])
@pytest.mark.parametrize("heads", [{"heads": "split"}, {"heads": "projected", "head_dim": 5}])
def test_module_is_the_float64_formula(heads, impl):
    attn = randomise(build(spec(6, eps=0.0, impl=impl, **heads), qkv_bias=True).double())
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    out, a = hedgehog_ref(q, k, v, attn.phi.weight, attn.phi.bias)
    torch.testing.assert_close(attn(x), module_out(attn, out), rtol=1e-10, atol=1e-12)
    index = torch.tensor([0, 5, 15])
    torch.testing.assert_close(attn.probs(x, q, k, None, False, index), a[:, :, index], rtol=1e-10, atol=1e-12)


def test_features_are_non_negative_rows_of_2m_summing_to_one():
    phi = randomise(build(spec(4))).phi
    f = phi(torch.randn(3, 2, 7, 8) * 20, is_query=True)
    assert f.shape == (3, 2, 7, 8) and phi.feature_dim == 8
    assert (f >= 0).all() and torch.isfinite(f).all()
    torch.testing.assert_close(f.sum(-1), torch.ones(3, 2, 7))
    half = hedgehog_features(torch.randn(1, 2, 3, 8, dtype=torch.bfloat16), phi.weight, phi.bias)
    assert half.dtype == torch.float32  # features in fp32 for half inputs


def test_fused_path_equals_eager_in_values_and_gradients():
    """The fused op (precomputed features through ``identity``) and the eager formula: the same output and the
    same gradients for the input, W, b and the projections."""
    x = torch.randn(2, 16, 16)
    results = {}
    for impl in ("torch", "eager"):
        attn = randomise(build(spec(8, impl=impl)))
        inp = x.clone().requires_grad_()
        out = attn(inp)
        out.square().sum().backward()
        results[impl] = (out, inp.grad, {n: p.grad for n, p in attn.named_parameters()})
    (out, dx, grads), (out_e, dx_e, grads_e) = results["torch"], results["eager"]
    torch.testing.assert_close(out, out_e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dx, dx_e, rtol=1e-5, atol=1e-6)
    assert {"phi.weight", "phi.bias"} <= set(grads)
    for name in grads:
        assert grads[name].abs().sum() > 0, name
        torch.testing.assert_close(grads[name], grads_e[name], rtol=1e-5, atol=1e-6, msg=name)


def test_exported_graph_carries_the_kernel_op_and_eager_output():
    """torch.export at W, b away from their start (b = 0 would hide a lost bias): the fused op, eager's output."""
    attn, x = randomise(build(spec(8))).eval(), torch.randn(2, 16, 16)
    exported = torch.export.export(attn, (x,))
    assert any(node.target is torch.ops.vitzoo.linear_attention.default for node in exported.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(x), attn(x), rtol=1e-5, atol=1e-6)


def test_gradcheck_in_w_and_b():
    attn = randomise(build(spec(3, heads="projected", head_dim=3), dim=8, tokens=4).double())
    assert gradcheck_module(attn, torch.randn(1, 4, 8, dtype=torch.float64))


def test_initialisation_is_the_identity_at_the_head_dim_else_semi_orthogonal():
    square = HedgehogFeatureMap(8, 2, num_features=8)
    assert torch.equal(square.weight, torch.eye(8).expand(2, 8, 8)) and not square.bias.any()
    for m in (4, 16):
        w = HedgehogFeatureMap(8, 2, num_features=m).weight.double()
        small = min(m, 8)
        gram = w.transpose(-2, -1) @ w if m < 8 else w @ w.transpose(-2, -1)
        torch.testing.assert_close(
            gram, torch.eye(small, dtype=torch.float64).expand(2, small, small), atol=1e-6, rtol=0
        )
        assert not torch.allclose(w[0], w[1])  # each head its own directions


@pytest.mark.parametrize(
    "options, fix",
    [
        ({"num_features": 0}, "num_features must be an integer >= 1"),
        ({"num_features": 2.5}, "num_features must be an integer >= 1"),
        ({"features": 8}, "valid options: \\['num_features'\\]"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(options, fix):
    assert_one_line_error({"name": "linear", "feature_map": {"name": "hedgehog", **options}}, fix, 16, 2)


def test_at_twice_the_resolution_in_both_backbones():
    check_double_resolution(
        spec(8, eps=0.0), lambda layer, q, k, v: hedgehog_ref(q, k, v, layer.phi.weight, layer.phi.bias)[0]
    )


@pytest.mark.parametrize(
    "attention",
    [spec(8), {"name": "performer", "num_features": 8}, {"name": "focused_linear"}],
    ids=["hedgehog", "performer", "focused_linear"],
)
@pytest.mark.parametrize("impl", ["auto", "eager"])
def test_precomputed_features_under_bf16_autocast(attention, impl):
    """Features in fp32, v in bf16 (bf16-mixed training): the fused path and eager run, give v's dtype, and stay
    within bf16 rounding of the fp32 output; every parameter gets a finite gradient."""
    attn, x = build({**attention, "impl": impl}), torch.randn(2, 16, 16)
    expected = attn(x).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attn(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.02)
    out.float().square().sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
