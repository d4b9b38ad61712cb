"""focused_linear (FLatten): the focused feature map and the depthwise conv on V against float64 formulas."""
import math

import pytest
import torch


from attention_reference import dwc_ref, kernel_ref, module_out, module_qkv, single_thread  # noqa: F401
from mech_checks import assert_one_line_error, build, check_double_resolution, gradcheck_module


def focused_ref(x, scale, p=3):
    """phi(x) = |r| r^p / |r^p| with r = relu(x) / softplus(s), norms over the head's channels."""
    r = x.double().clamp(min=0) / torch.log1p(torch.exp(scale.double()))
    rp = r ** p
    return r.norm(dim=-1, keepdim=True) * rp / rp.norm(dim=-1, keepdim=True).clamp(min=1e-300)


def reference(layer, q, k, v, eps=1e-8):
    """A v + DWC(v), A_ij = phi(q_i).phi(k_j) / (sum_j phi(q_i).phi(k_j) + eps)."""
    out, _ = kernel_ref(q, k, v, lambda x: focused_ref(x, layer.phi.scale, layer.phi.power), eps)
    return out + dwc_ref(v, layer.dwc, layer.current_grid(q.shape[-2]), layer.num_prefix_tokens)


def randomised(attn):
    """Nonzero learnable scales, so the test sees them."""
    with torch.no_grad():
        attn.phi.scale.normal_()
    return attn


@pytest.mark.parametrize("heads", [{"heads": "split"}, {"heads": "projected", "head_dim": 5}])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("kernel_size", [0, 5])  # 0: no conv term
def test_module_is_the_float64_formula(heads, prefix, kernel_size):
    attn = randomised(build({"name": "focused_linear", "kernel_size": kernel_size, **heads}, tokens=prefix + 16,
                            prefix=prefix, qkv_bias=True)).double()
    x = torch.randn(2, prefix + 16, 16, dtype=torch.float64)
    expected = module_out(attn, reference(attn, *module_qkv(attn, x)))
    torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-12)


def test_power_one_is_relu_linear_attention_plus_the_conv():
    """f_1 is the identity and a scale common to q and k cancels: phi = relu (up to the denominator's eps)."""
    attn = build({"name": "focused_linear", "power": 1.0, "eps": 0.0}).double()
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    expected = kernel_ref(q, k, v, "relu", eps=0.0)[0] + dwc_ref(v, attn.dwc, (4, 4), 0)
    torch.testing.assert_close(attn(x), module_out(attn, expected), rtol=1e-10, atol=1e-12)


def test_focus_keeps_the_norm_and_sharpens_the_direction():
    r = torch.tensor([[1.0, 2.0, 0.5, 0.0]], dtype=torch.float64)
    phi = focused_ref(r, torch.full((4,), math.log(math.e - 1), dtype=torch.float64))  # softplus(s) = 1
    torch.testing.assert_close(phi.norm(), r.norm())
    ones = torch.ones(1, 4, dtype=torch.float64)
    assert torch.cosine_similarity(phi, ones) < torch.cosine_similarity(r, ones)  # pulled toward its largest channel


def test_gradcheck():
    attn = randomised(build({"name": "focused_linear", "heads": "projected", "head_dim": 3, "kernel_size": 3},
                            dim=8, tokens=5, prefix=1)).double()
    assert gradcheck_module(attn, torch.randn(1, 5, 8, dtype=torch.float64).abs())


def test_the_conv_follows_the_grid_and_leaves_prefix_tokens_alone():
    attn = build({"name": "focused_linear", "impl": "eager"}, tokens=1 + 12, prefix=1).double()
    attn.token_grid = (3, 4)  # non-square: h, w must not be swapped
    x = torch.randn(2, 13, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    torch.testing.assert_close(attn(x), module_out(attn, reference(attn, q, k, v)), rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        attn.dwc.weight.zero_()
        attn.dwc.bias.zero_()
        y = attn(x)
    torch.testing.assert_close(y, module_out(attn, kernel_ref(focused_ref(q, attn.phi.scale),
                                                              focused_ref(k, attn.phi.scale), v, "relu", eps=1e-8)[0]))


@pytest.mark.parametrize("spec, kwargs, fix", [
    ({"name": "focused_linear", "feature_map": "elu"}, {}, "drop feature_map"),
    ({"name": "focused_linear", "power": 0}, {}, "power must be > 0"),
    ({"name": "focused_linear", "kernel_size": 4}, {}, "odd"),
    ({"name": "focused_linear", "causal": True}, {}, "drop causal"),
    ({"name": "focused_linear", "scale": "log_n"}, {}, "no option"),
    ("focused_linear", dict(attn_drop=0.1), "attn_drop_rate=0"),
])
def test_bad_options_are_one_line_naming_the_fix(spec, kwargs, fix):
    assert_one_line_error(spec, fix, 16, 2, **kwargs)


def test_at_twice_the_resolution_in_both_backbones():
    check_double_resolution({"name": "focused_linear"}, reference)
