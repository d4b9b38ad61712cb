"""inline (InLine): injective weights 1/n + tau/n (q.k_j - q.kbar) and the dynamic 3x3 local residual against
float64 formulas."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attention_reference import dwc_ref, module_out, module_qkv, single_thread  # noqa: F401
from mech_checks import assert_one_line_error, build, gradcheck_module
from recent_checks import check_formula, check_fused_equals_eager, check_resolutions, probs_at


def weights_ref(q, k):
    """w_ij = 1/n + (tau/n) (q_i.k_j - q_i.kbar)."""
    n, tau = k.shape[-2], q.shape[-1] ** -0.5
    sim = q @ k.transpose(-2, -1)
    return 1 / n + tau / n * (sim - sim.mean(-1, keepdim=True))


def grouped_1x1(conv, x):
    """A grouped 1x1 Conv1d on (B, C_in) written out: group g's outputs from group g's inputs."""
    w, b, groups = conv.weight.double()[..., 0], conv.bias.double(), conv.groups
    ins, outs = w.shape[1], w.shape[0] // groups
    parts = [x[:, g * ins : (g + 1) * ins] @ w[g * outs : (g + 1) * outs].T for g in range(groups)]
    return torch.cat(parts, dim=-1) + b


def residual_ref(layer, x, v):
    """Per image: kernels from the mean token (grouped 1x1, GELU, grouped 1x1 to 9 per channel), a 3x3 depthwise
    conv of v's grid tokens (zero padding, no bias); prefix rows 0."""
    gen1, gen2 = layer.kernel_gen[0], layer.kernel_gen[2]
    kernels = grouped_1x1(gen2, F.gelu(grouped_1x1(gen1, x.double().mean(1))))
    B, H, N, D = v.shape
    kernels = kernels.reshape(B, H * D, 1, 3, 3)
    zero = torch.zeros(H * D, dtype=torch.float64)
    return torch.cat(
        [
            dwc_ref(
                v[b : b + 1],
                SimpleNamespace(weight=kernels[b], bias=zero),
                layer.current_grid(N),
                layer.num_prefix_tokens,
            )
            for b in range(B)
        ]
    )


def reference(layer, x):
    q, k, v = module_qkv(layer, x)
    out = weights_ref(q, k) @ v
    if layer.kernel_gen is not None:
        out = out + residual_ref(layer, x, v)
    return module_out(layer, out)


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("options", [{}, {"residual": False}, {"heads": "projected", "head_dim": 5}])
def test_module_is_the_float64_formula(prefix, options):
    layer = build({"name": "inline", **options}, tokens=prefix + 16, prefix=prefix, qkv_bias=True).double()
    check_formula(layer, reference, prefix + 16)


def test_rows_sum_to_one_and_probs_are_the_weights_shares():
    layer = build({"name": "inline", "residual": False}, tokens=17, prefix=1).double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = module_qkv(layer, x)
    w = weights_ref(q, k)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w[..., 0]))
    assert (w < 0).any()  # signed: the diagnostics see |w| as a distribution
    index = torch.tensor([0, 7, 16])
    torch.testing.assert_close(probs_at(layer, x, index), (w.abs() / w.abs().sum(-1, keepdim=True))[:, :, index])
    with torch.no_grad():  # constant values come back unchanged: the weights have no denominator to miss
        layer.in_proj.proj.weight[32:].zero_()
        layer.in_proj.proj.weight[32:, 0] = 1.0
    torch.testing.assert_close(
        layer(torch.ones(2, 17, 16, dtype=torch.float64)),
        module_out(layer, torch.ones(2, 2, 17, 8, dtype=torch.float64)),
    )


def test_noise_weights_every_mean_and_keeps_rows_summing_to_one():
    layer = build({"name": "inline", "residual": False, "logit_noise": 2.0}).train().double()
    with torch.no_grad():
        layer.in_proj.proj.weight[32:].zero_()
        layer.in_proj.proj.weight[32:, 0] = 1.0  # v = [x_0, ..., x_0]: a constant input gives constant values
    x = torch.ones(2, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), module_out(layer, torch.ones(2, 2, 16, 8, dtype=torch.float64)))
    y = torch.randn(2, 16, 16, dtype=torch.float64)
    assert not torch.allclose(layer(y), layer.eval()(y))  # the noise moves a non-constant input's output


@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_fused_equals_eager_with_gradients(impl):
    fused = build({"name": "inline", "impl": impl}, tokens=17, prefix=1, qkv_bias=True)
    eager = build({"name": "inline", "impl": "eager"}, tokens=17, prefix=1, qkv_bias=True)
    check_fused_equals_eager(fused, eager, torch.randn(2, 17, 16))


def test_gradcheck():
    layer = build({"name": "inline"}, dim=8, tokens=5, prefix=1, qkv_bias=True).double()
    assert gradcheck_module(layer, torch.randn(1, 5, 8, dtype=torch.float64), fast_mode=True)


@pytest.mark.parametrize(
    "spec, kwargs, fix",
    [
        ({"name": "inline", "heads": "projected", "head_dim": 4}, dict(num_heads=3), "must divide dim"),
        ({"name": "inline", "impl": "cuda"}, {}, "impl"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, kwargs, fix):
    assert_one_line_error(spec, fix, 16, kwargs.pop("num_heads", 2), **kwargs)


def test_at_one_and_a_half_and_twice_the_resolution_in_both_backbones():
    check_resolutions("inline", reference)
