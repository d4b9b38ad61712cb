"""focused_linear (FLatten) against a float64 transcription of the official FocusedLinearAttention: focusing
norms over the whole token, +1e-6 after the ReLU, the learned key position encoding, the mean-based denominator."""

import pytest
import torch
import torch.nn.functional as F

from attention_reference import dwc_ref, module_out, module_qkv, single_thread  # noqa: F401
from mech_checks import (
    assert_one_line_error,
    build,
    check_double_resolution,
    check_onnx_at_another_size,
    gradcheck_module,
)
from vitzoo.attention import build_attention
from vitzoo.attention.focused_linear import focus


def pos_ref(layer, n):
    """The key position encoding at ``n`` tokens (float64, (n, H*D)): the built rows, or the prefix rows kept
    and the grid rows resized bilinearly (half-pixel centres) to the current grid."""
    if layer.pos is None:
        return 0.0
    weight, built = layer.pos.weight.double(), layer.built_layout
    grid = layer.current_grid(n)
    if n == built.tokens and tuple(grid) == (built.h, built.w):
        return weight
    rows = weight[built.prefix :].T.reshape(1, -1, built.h, built.w)
    rows = F.interpolate(rows, size=tuple(grid), mode="bilinear", align_corners=False)
    return torch.cat([weight[: built.prefix], rows.reshape(weight.shape[1], -1).T])


def flatten_ref(layer, q, k, v):
    """The official forward on (B, H, N, D) heads, in float64: tokens are the heads' channels side by side
    (B, N, H*D); k += P; x -> (relu(x) + 1e-6) / softplus(s); f_3 with norms over all H*D channels (``head``:
    over each head's D); per head o = q (k^T v / n) / (q . mean_j k_j + 1e-6), plus DWC(v)."""
    B, H, N, D = q.shape
    tokens = [t.double().transpose(1, 2).reshape(B, N, H * D) for t in (q, k)]
    tokens[1] = tokens[1] + pos_ref(layer, N)
    scale = torch.log1p(torch.exp(layer.phi.scale.double())).reshape(H * D)
    p = layer.phi.power
    feats = []
    for t in tokens:
        t = (t.clamp(min=0) + 1e-6) / scale
        if layer.phi.norm == "head":
            t = t.reshape(B, N, H, D)
        t = t.norm(dim=-1, keepdim=True) * t**p / (t**p).norm(dim=-1, keepdim=True)
        feats.append(t.reshape(B, N, H, D).transpose(1, 2))
    fq, fk = feats
    v64 = v.double()
    z = 1 / (fq @ fk.mean(dim=-2, keepdim=True).transpose(-2, -1) + layer.eps)
    out = fq @ ((fk.transpose(-2, -1) * N**-0.5) @ (v64 * N**-0.5)) * z
    return out + dwc_ref(v, layer.dwc, layer.current_grid(N), layer.num_prefix_tokens)


def randomised(attn):
    """Nonzero learnable scales and position encoding, so the test sees them."""
    with torch.no_grad():
        attn.phi.scale.normal_()
        if attn.pos is not None:
            attn.pos.weight.normal_()
    return attn


def check(attn, x):
    torch.testing.assert_close(
        attn(x), module_out(attn, flatten_ref(attn, *module_qkv(attn, x))), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("heads", [{"heads": "split"}, {"heads": "projected", "head_dim": 5}])
@pytest.mark.parametrize("num_heads", [1, 2, 4])
@pytest.mark.parametrize("prefix", [0, 1])
def test_module_is_the_official_formula(heads, num_heads, prefix):
    attn = randomised(
        build(
            {"name": "focused_linear", **heads}, num_heads=num_heads, tokens=prefix + 16, prefix=prefix, qkv_bias=True
        )
    ).double()
    check(attn, torch.randn(2, prefix + 16, 16, dtype=torch.float64))


@pytest.mark.parametrize(
    "spec",
    [{"kernel_size": 0}, {"pos_embed": False}, {"focus_norm": "head"}, {"power": 2.0, "eps": 1e-3}],
    ids=["no-conv", "no-pos", "head-norm", "p2-eps"],
)
def test_each_option_is_the_formula(spec):
    attn = randomised(build({"name": "focused_linear", **spec}, num_heads=4, tokens=17, prefix=1)).double()
    check(attn, torch.randn(2, 17, 16, dtype=torch.float64))


def test_the_norm_over_the_token_weights_keys_unlike_the_norm_per_head():
    """FLatten's norm and the per-head one differ by far more than rounding with several heads, agree with one."""
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    for num_heads, differ in ((1, False), (4, True)):
        token, head = (
            randomised(build({"name": "focused_linear", "focus_norm": norm}, num_heads=num_heads)).double()
            for norm in ("token", "head")
        )
        gap = (token(x) - head(x)).abs().max().item()
        assert (gap > 1e-3) == differ, gap


def test_focus_keeps_the_norm_and_sharpens_the_direction():
    r = torch.tensor([[1.0, 2.0, 0.5, 1e-6]], dtype=torch.float64)
    phi = focus(r, 3.0)
    torch.testing.assert_close(phi.norm(), r.norm())
    ones = torch.ones(1, 4, dtype=torch.float64)
    assert torch.cosine_similarity(phi, ones) < torch.cosine_similarity(r, ones)  # pulled toward its largest channel


def test_gradcheck():
    attn = randomised(
        build(
            {"name": "focused_linear", "heads": "projected", "head_dim": 3, "kernel_size": 3}, dim=8, tokens=5, prefix=1
        )
    ).double()
    assert gradcheck_module(attn, torch.randn(1, 5, 8, dtype=torch.float64).abs())


def test_fused_path_equals_eager_with_gradients():
    """The default path (features handed to the fused O(n) op) and the plain formula: outputs and every gradient."""
    x = torch.randn(2, 17, 16)
    results = []
    for impl in ("torch", "eager"):
        attn = randomised(build({"name": "focused_linear", "impl": impl}, num_heads=4, tokens=17, prefix=1))
        xi = x.clone().requires_grad_()
        out = attn(xi)
        out.square().sum().backward()
        results.append([out, xi.grad, *(p.grad for p in attn.parameters())])
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_the_conv_follows_the_grid_and_leaves_prefix_tokens_alone():
    torch.manual_seed(0)
    attn = randomised(
        build_attention(
            {"name": "focused_linear", "impl": "eager"},
            16,
            num_heads=2,
            num_tokens=13,
            num_prefix_tokens=1,
            grid_size=(3, 4),
        )
    )  # non-square: h, w not swapped
    attn.token_grid = (3, 4)
    check(attn.double(), torch.randn(2, 13, 16, dtype=torch.float64))


def test_a_state_dict_from_another_grid_is_resampled_on_load():
    """Saved at 4x4, loaded into an 8x8 build: the position rows are the resampled ones (prefix row kept)."""
    small = randomised(build({"name": "focused_linear"}, tokens=17, prefix=1))
    large = build({"name": "focused_linear"}, tokens=65, prefix=1)
    large.load_state_dict(small.state_dict())
    small.token_grid = (8, 8)
    torch.testing.assert_close(large.pos.weight.double(), pos_ref(small, 65), rtol=1e-6, atol=1e-6)


def test_legacy_onnx_export_at_another_size_keeps_the_position_encoding():
    check_onnx_at_another_size("focused_linear", randomised)


@pytest.mark.parametrize(
    "spec, kwargs, fix",
    [
        ({"name": "focused_linear", "feature_map": "elu"}, {}, "drop feature_map"),
        ({"name": "focused_linear", "power": 0}, {}, "power must be > 0"),
        ({"name": "focused_linear", "focus_norm": "channel"}, {}, "focus_norm"),
        ({"name": "focused_linear", "pos_embed": "yes"}, {}, "true or false"),
        ({"name": "focused_linear", "kernel_size": 4}, {}, "odd"),
        ({"name": "focused_linear", "causal": True}, {}, "drop causal"),
        ({"name": "focused_linear", "scale": "log_n"}, {}, "no option"),
        ("focused_linear", dict(attn_drop=0.1), "attn_drop_rate=0"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, kwargs, fix):
    assert_one_line_error(spec, fix, 16, 2, **kwargs)


def test_without_interpolate_another_grid_is_an_error_naming_it():
    attn = build({"name": "focused_linear", "interpolate": False}, tokens=16)
    with pytest.raises(ValueError, match="interpolate: true"):
        attn(torch.randn(1, 64, 16))


def test_at_twice_the_resolution_in_both_backbones():
    """The position encoding resampled to the doubled grid (randomised first: it starts at 0)."""
    check_double_resolution({"name": "focused_linear"}, flatten_ref, prepare=randomised)


def test_probs_are_the_attention_terms_rows_as_distributions():
    """The implied matrix phi(q_i).phi(k_j) / sum_j' phi(q_i).phi(k_j') (eps's share left out) from the reference's
    features: applied to v it is the output without eps and the conv."""
    attn = randomised(
        build({"name": "focused_linear", "kernel_size": 0, "eps": 0.0}, num_heads=4, tokens=17, prefix=1)
    ).double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    p = attn.probs(x, q, k, None, False, torch.arange(17))
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 17, dtype=torch.float64))
    torch.testing.assert_close(p @ v, flatten_ref(attn, q, k, v), rtol=1e-10, atol=1e-12)
