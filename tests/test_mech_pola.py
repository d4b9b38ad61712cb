"""pola (PolaFormer): polarity streams, learnable power and scale, key positions, shared DWC and the linear gate
against float64 formulas."""

import pytest
import torch
import torch.nn.functional as F

from attention_reference import dwc_ref, module_qkv, single_thread  # noqa: F401
from mech_checks import assert_one_line_error, build, gradcheck_module
from recent_checks import check_formula, check_fused_equals_eager, check_resolutions, gated_out, probs_at


def key_positions_ref(layer, n):
    """P (H, n, d): the built table, its grid rows resized bilinearly when the grid differs, prefix rows kept."""
    P = layer.key_positions.weight.double()
    built, prefix = layer.built_layout, layer.num_prefix_tokens
    grid = layer.current_grid(n)
    if (built.h, built.w) == tuple(grid):
        return P
    H, _, D = P.shape
    img = P[:, prefix:].permute(0, 2, 1).reshape(1, H * D, built.h, built.w)
    img = F.interpolate(img, size=tuple(grid), mode="bilinear", align_corners=False)
    return torch.cat([P[:, :prefix], img.reshape(H, D, -1).permute(0, 2, 1)], dim=1)


def streams_ref(layer, q, k):
    """The same-sign and opposite-sign similarity matrices (B, H, n, n)."""
    k = k + key_positions_ref(layer, k.shape[-2])
    s = torch.log1p(torch.exp(layer.scale.double()))
    p = 1 + layer.alpha * torch.sigmoid(layer.power.double())
    q, k = q / s, k / s
    qp, qn, kp, kn = (t.clamp(min=0) ** p for t in (q, -q, k, -k))
    return qp @ kp.transpose(-2, -1) + qn @ kn.transpose(-2, -1), qn @ kp.transpose(-2, -1) + qp @ kn.transpose(-2, -1)


def reference(layer, x, eps=1e-6):
    """proj(([A^S v1, A^O v2] + DWC(v)) * g), A^* = sim^* / (row sum + n eps); DWC shared by the heads."""
    q, k, v = module_qkv(layer, x)
    same, opposite = streams_ref(layer, q, k)
    n, half = k.shape[-2], v.shape[-1] // 2
    out = torch.cat(
        [
            same / (same.sum(-1, keepdim=True) + n * eps) @ v[..., :half],
            opposite / (opposite.sum(-1, keepdim=True) + n * eps) @ v[..., half:],
        ],
        dim=-1,
    )
    if layer.dwc is not None:
        B, H, N, D = v.shape
        out = out + dwc_ref(
            v.reshape(B * H, 1, N, D), layer.dwc, layer.current_grid(N), layer.num_prefix_tokens
        ).reshape(B, H, N, D)
    return gated_out(layer, x, out)


def randomised(layer):
    """Nonzero scale, power, key positions and gate bias, so the test sees them."""
    with torch.no_grad():
        for p in (layer.scale, layer.power, layer.key_positions.weight):
            p.normal_(std=0.5)
    return layer


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("options", [{}, {"kernel_size": 0}, {"heads": "projected", "head_dim": 6}, {"alpha": 1.5}])
def test_module_is_the_float64_formula(prefix, options):
    layer = randomised(build({"name": "pola", **options}, tokens=prefix + 16, prefix=prefix, qkv_bias=True)).double()
    check_formula(layer, reference, prefix + 16)


def test_probs_average_the_two_streams_row_shares():
    layer = randomised(build("pola", tokens=17, prefix=1)).double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, _ = module_qkv(layer, x)
    same, opposite = streams_ref(layer, q, k)
    expected = (same / same.sum(-1, keepdim=True) + opposite / opposite.sum(-1, keepdim=True)) / 2
    index = torch.tensor([0, 5, 16])
    torch.testing.assert_close(probs_at(layer, x, index), expected[:, :, index], rtol=1e-10, atol=1e-12)


def test_power_starts_at_three_and_the_gate_multiplies_the_output():
    layer = build("pola").double()
    assert torch.equal(1 + layer.alpha * torch.sigmoid(layer.power), torch.full_like(layer.power, 3.0))
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        layer.gate.weight.zero_()
    torch.testing.assert_close(layer(x), layer.proj.bias.expand(2, 16, -1))  # a zero gate leaves the proj bias


@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_fused_equals_eager_with_gradients(impl):
    fused = randomised(build({"name": "pola", "impl": impl}, tokens=17, prefix=1, qkv_bias=True))
    eager = build({"name": "pola", "impl": "eager"}, tokens=17, prefix=1, qkv_bias=True)
    check_fused_equals_eager(fused, eager, torch.randn(2, 17, 16))


def test_gradcheck():
    layer = randomised(build({"name": "pola", "kernel_size": 3}, dim=8, tokens=5, prefix=1, qkv_bias=True)).double()
    assert gradcheck_module(layer, torch.randn(1, 5, 8, dtype=torch.float64), fast_mode=True)


def test_key_positions_are_resampled_or_refused_at_another_grid():
    layer = randomised(build({"name": "pola", "interpolate": False}, tokens=17, prefix=1))
    with pytest.raises(ValueError, match="interpolate: true"):
        layer(torch.randn(1, 26, 16))
    state = layer.state_dict()
    bigger = build("pola", tokens=1 + 36, prefix=1)
    bigger.load_state_dict(state)  # a state dict saved at 4x4 loads into a 6x6 build, P resampled
    assert bigger.key_positions.weight.shape == (2, 37, 8)
    torch.testing.assert_close(bigger.key_positions.weight[:, :1], state["key_positions.weight"][:, :1])


@pytest.mark.parametrize(
    "spec, fix",
    [
        ({"name": "pola", "head_dim": 5, "heads": "projected"}, "must be even"),
        ({"name": "pola", "alpha": 0}, "alpha"),
        ({"name": "pola", "kernel_size": 4}, "odd"),
        ({"name": "pola", "impl": "cuda"}, "impl"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, fix):
    assert_one_line_error(spec, fix, 16, 2, num_tokens=16)


def test_at_one_and_a_half_and_twice_the_resolution_in_both_backbones():
    check_resolutions("pola", reference, randomised)
