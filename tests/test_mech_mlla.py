"""mlla (MLLA's attention): elu+1 features, MLLA's channel-wide RoPE as complex rotations, the unrotated normaliser
and LePE against float64 formulas."""

import pytest
import torch
from hydra.utils import instantiate

import vitzoo
from conftest import compose_config
from vitzoo.training import build_classifier

from attention_reference import dwc_ref, module_out, module_qkv, phi, single_thread  # noqa: F401
from mech_checks import assert_one_line_error, build, gradcheck_module, tiny_vit
from recent_checks import check_formula, check_resolutions, grid_positions, lepe_heads_ref, probs_at, rotate_complex
from recent_checks import row_shares


def angles_ref(layer, n):
    """MLLA: over the C = H*d channels, pair m < C/4 turns by row * 10000^(-m/(C/4)), pair m >= C/4 by
    column * 10000^(-(m - C/4)/(C/4)); head h holds pairs h*d/2 .. (h+1)*d/2 - 1."""
    rows, cols = grid_positions(layer.current_grid(n), layer.num_prefix_tokens)
    C = layer.num_heads * layer.head_dim
    table = torch.empty(n, C // 2, dtype=torch.float64)
    for m in range(C // 2):
        axis, k = (rows, m) if m < C // 4 else (cols, m - C // 4)
        table[:, m] = axis * 10000.0 ** (-k / (C // 4))
    return table.reshape(n, layer.num_heads, -1).transpose(0, 1)


def weights_ref(layer, q, k, eps=1e-6):
    """(R_i phi q_i).(R_j phi k_j) / (phi q_i . sum_j phi k_j + n eps)."""
    fq, fk = phi(q, "elu"), phi(k, "elu")
    angles = angles_ref(layer, q.shape[-2])
    num = rotate_complex(fq, angles) @ rotate_complex(fk, angles).transpose(-2, -1)
    return num / (fq @ fk.sum(-2).unsqueeze(-1) + k.shape[-2] * eps), num


def reference(layer, x):
    return module_out(layer, lepe_heads_ref(layer, x, weights_ref))


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("options", [{}, {"kernel_size": 0}, {"heads": "projected", "head_dim": 6}])
def test_module_is_the_float64_formula(prefix, options):
    layer = build({"name": "mlla", **options}, tokens=prefix + 16, prefix=prefix, qkv_bias=True).double()
    layer.token_grid = (2, 8)  # non-square: rows and columns must not be swapped
    check_formula(layer, reference, prefix + 16)


def test_each_head_turns_along_one_axis_and_probs_are_the_weights_shares():
    layer = build("mlla", tokens=17, prefix=1).double()
    angles = angles_ref(layer, 17)
    rows, cols = grid_positions((4, 4), 1)
    assert torch.equal(angles[0] == 0, (rows == 0)[:, None].expand(-1, 4))  # head 0: rows only
    assert torch.equal(angles[1] == 0, (cols == 0)[:, None].expand(-1, 4))  # head 1: columns only
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    index = torch.tensor([0, 4, 16])
    expected = row_shares(weights_ref(layer, *module_qkv(layer, x)[:2])[1])[:, :, index]
    torch.testing.assert_close(probs_at(layer, x, index), expected)


def test_gradcheck():
    layer = build({"name": "mlla"}, dim=8, tokens=5, prefix=1, qkv_bias=True).double()
    assert gradcheck_module(layer, torch.randn(1, 5, 8, dtype=torch.float64), fast_mode=True)


@pytest.mark.parametrize(
    "spec, fix",
    [
        ({"name": "mlla", "heads": "projected", "head_dim": 3}, "must be even"),
        ({"name": "mlla", "kernel_size": 2}, "odd"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, fix):
    assert_one_line_error(spec, fix, 16, 2)


def test_at_one_and_a_half_and_twice_the_resolution_in_both_backbones():
    check_resolutions("mlla", reference)


# -- MLLA's block (block="mlla") -------------------------------------------------------------------------------
def block_reference(block, x):
    """The block from its formula in float64: CPE1, the gated attention branch, CPE2, the MLP; the 3x3 convs over
    grid tokens only (prefix tokens get no CPE term and skip DWConv); norms, MLP and the attention as modules."""

    def conv(c, t):
        return dwc_ref(t.unsqueeze(1), c, block.attn.current_grid(t.shape[1]), block.attn.num_prefix_tokens)[:, 0]

    def linear(m, t):
        return t @ m.weight.T + m.bias

    prefix = block.attn.num_prefix_tokens
    x = x + conv(block.cpe1, x)
    u = block.norm1(x)
    a = linear(block.in_proj, u)
    a = torch.cat([a[:, :prefix], conv(block.dwc, a)[:, prefix:]], dim=1)
    a = block.attn(a * torch.sigmoid(a)) * (lambda g: g * torch.sigmoid(g))(linear(block.act_proj, u))
    x = x + linear(block.out_proj, a)
    x = x + conv(block.cpe2, x)
    return x + block.mlp(block.norm2(x))


def mlla_block_vit(attention="mlla", **kwargs):
    torch.manual_seed(0)
    return tiny_vit(attention, block="mlla", depth=2, **kwargs)


@pytest.mark.parametrize("px", [32, 48])
def test_the_mlla_block_is_its_formula_at_two_resolutions(px):
    model = mlla_block_vit(reg_tokens=1).double().eval()
    with torch.no_grad():
        for conv in (b.cpe1 for b in model.blocks):
            conv.bias.normal_()
    seen = []
    hooks = [b.register_forward_hook(lambda m, args, out: seen.append((m, args[0], out))) for b in model.blocks]
    with torch.no_grad():
        model(torch.randn(2, 3, px, px, dtype=torch.float64))
        for h in hooks:
            h.remove()
        assert [type(b).__name__ for b in model.blocks] == ["MllaBlock"] * 2 and len(seen) == 2
        for block, x, out in seen:
            assert block.attn.token_grid == (px // 8, px // 8) and x.shape[1] == 2 + (px // 8) ** 2
            torch.testing.assert_close(out, block_reference(block, x), rtol=1e-9, atol=1e-11)


def test_the_mlla_block_trains_exports_and_composes_in_hydra(tmp_path):
    model = mlla_block_vit(["mlla", "softmax"])
    x = torch.randn(2, 3, 32, 32)
    model(x).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.export.export(model, (x,)).module()(x), model(x), rtol=1e-5, atol=1e-6)
    cfg = compose_config(tmp_path, ["debug=tiny_vit", "model=vit_mlla", "+model.kwargs.block=mlla"])
    module = build_classifier(cfg, instantiate(cfg.data))
    assert type(module.model.blocks[0]).__name__ == "MllaBlock"
    with pytest.raises(ValueError, match="unknown block='mamba'; choose one of"):
        vitzoo.create_model("vit_tiny", block="mamba")
