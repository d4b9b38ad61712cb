"""Window attention against softmax over Swin's partition (pad, cyclic shift, region mask), float64."""

import math

import pytest
import torch

import vitzoo
from vitzoo.attention.window import WindowAttention
from vitzoo.diagnostics import capture_attention

from attention_reference import module_out, module_qkv, single_thread, softmax_ref  # noqa: F401
from mech_checks import assert_bad_option, check_onnx_at_another_size, gradcheck_module
from mech_checks import build as build_module

DIM, HEADS, GRID = 8, 2, (5, 7)  # non-square, divisible by neither window side


def build(spec, grid=GRID, prefix=1, shifted=False, seed=0):
    m = build_module(
        {"name": "window", **spec}, DIM, HEADS, prefix=prefix, seed=seed, grid=grid, qkv_bias=True
    ).double()
    m.token_grid, m.block_index = grid, int(shifted)
    return m


def axis_labels(g, w, shifted):
    """Swin along one axis: pad to a multiple of w, roll by -w//2, label (window, region) of each token."""
    w = min(w, g)
    s = w // 2 if shifted and g > w else 0
    padded = -(-g // w) * w
    pos = (torch.arange(g) - s) % padded  # where torch.roll(x, -s) puts token r
    region = torch.zeros(g, dtype=torch.long)
    if s:  # Swin's slices (0, -w), (-w, -s), (-s, None) of the shifted frame
        region = (pos >= padded - w).long() + (pos >= padded - s).long()
    return (pos // w) * 3 + region


def swin_keep(grid, w, shifted, prefix):
    """(N, N) bool: patch tokens attend their window (same window and region); prefix tokens are global."""
    rows = axis_labels(grid[0], w, shifted)[:, None].expand(grid).flatten()
    cols = axis_labels(grid[1], w, shifted)[None, :].expand(grid).flatten()
    keep = (rows[:, None] == rows[None, :]) & (cols[:, None] == cols[None, :])
    n = prefix + keep.shape[0]
    full = torch.ones(n, n, dtype=torch.bool)
    full[prefix:, prefix:] = keep
    return full


def swin_bias(table, grid, w, shifted, prefix):
    """(H, N, N) float64: Swin's relative position bias B[(dy + w - 1)(2w - 1) + dx + w - 1] of two patch tokens,
    dy, dx their offsets in the rolled frame where they share a window (entries elsewhere are masked); 0 for the
    prefix rows and columns."""
    rolled = []
    for g in grid:
        ww = min(w, g)
        s = ww // 2 if shifted and g > ww else 0
        rolled.append((torch.arange(g) - s) % (-(-g // ww) * ww))
    rows = rolled[0][:, None].expand(grid).flatten()
    cols = rolled[1][None, :].expand(grid).flatten()
    dy = (rows[:, None] - rows[None, :]).clamp(-(w - 1), w - 1)
    dx = (cols[:, None] - cols[None, :]).clamp(-(w - 1), w - 1)
    bias = table.detach().double()[(dy + w - 1) * (2 * w - 1) + dx + w - 1].permute(2, 0, 1)
    return torch.nn.functional.pad(bias, (prefix, 0, prefix, 0))


def tokens(prefix=1, grid=GRID, batch=2):
    return torch.randn(batch, prefix + grid[0] * grid[1], DIM, dtype=torch.float64)


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("shifted", [False, True])
def test_output_and_matrix_are_softmax_over_the_swin_partition(prefix, shifted):
    m = build({"window_size": 3}, prefix=prefix, shifted=shifted)
    x = tokens(prefix)
    q, k, v = module_qkv(m, x)
    out, attn = softmax_ref(q, k, v, mask=swin_keep(GRID, 3, shifted, prefix))
    torch.testing.assert_close(m(x), module_out(m, out), rtol=1e-10, atol=1e-10)
    index = torch.arange(x.shape[1])
    torch.testing.assert_close(m.probs(x, *m.project(x)[:2], None, False, index), attn, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("grid, w", [(GRID, 3), ((2, 7), 3)], ids=["5x7", "clipped-2x7"])
@pytest.mark.parametrize("shifted", [False, True])
def test_the_relative_position_bias_is_swins(shifted, grid, w):
    """rel_pos: Swin's table indexed by the offsets within the rolled window, on the logits; the module's output
    and implied matrix against softmax with that bias over the Swin partition (an axis shorter than w keeps the
    table of w)."""
    m = build({"window_size": w, "rel_pos": True}, grid=grid, shifted=shifted)
    x = tokens(grid=grid)
    q, k, v = module_qkv(m, x)
    keep = swin_keep(grid, w, shifted, 1)
    mask = torch.where(keep, swin_bias(m.rel_table, grid, w, shifted, 1), -math.inf)
    out, attn = softmax_ref(q, k, v, mask=mask)
    torch.testing.assert_close(m(x), module_out(m, out), rtol=1e-10, atol=1e-10)
    index = torch.arange(x.shape[1])
    torch.testing.assert_close(m.probs(x, *m.project(x)[:2], None, False, index), attn, rtol=1e-10, atol=1e-12)


def test_a_window_covering_the_grid_is_softmax_attention():
    m = build({"window_size": 7}, shifted=True)  # 7 >= both sides: one window, nothing to shift
    x = tokens()
    q, k, v = module_qkv(m, x)
    torch.testing.assert_close(m(x), module_out(m, softmax_ref(q, k, v)[0]), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shifted", [False, True])
def test_tokens_in_other_windows_have_no_influence(shifted):
    """d out_i / d x_j is zero exactly where token j is outside query i's window (prefix is global)."""
    m = build({"window_size": 3}, shifted=shifted)
    keep = swin_keep(GRID, 3, shifted, 1)
    for i in (0, 1, 9, 20, 35):
        x = tokens(batch=1).requires_grad_()
        m(x)[0, i].square().sum().backward()
        assert torch.equal(x.grad[0].abs().sum(-1) > 0, keep[i]), f"query {i}"


def test_log_n_scale_counts_the_keys_each_query_attends():
    """Reference: a full 3x3 window plus the class token at the build grid (10 keys)."""
    m = build({"window_size": 3, "scale": "log_n"}, grid=(4, 4), shifted=True)
    m.token_grid = GRID
    x = tokens()
    q, k, v = module_qkv(m, x)
    keep = swin_keep(GRID, 3, True, 1)
    d = DIM // HEADS
    scale = math.sqrt(d) / math.log(10) * keep.sum(-1, keepdim=True).double().log() / d
    out = softmax_ref(q * scale, k, v, scale=1.0, mask=keep)[0]
    torch.testing.assert_close(m(x), module_out(m, out), rtol=1e-10, atol=1e-10)
    assert keep.sum(-1).max() == x.shape[1] and keep.sum(-1)[1:].max() == 10  # class row global, windows full


def test_relative_position_bias_through_the_legacy_onnx_exporter():
    check_onnx_at_another_size({"name": "window", "window_size": 3, "rel_pos": True}, lambda layer: None)


def test_gradcheck():
    m = build({"window_size": 2, "heads": "projected", "head_dim": 3, "rel_pos": True}, grid=(3, 3), shifted=True)
    x = tokens(grid=(3, 3), batch=1).requires_grad_()
    assert gradcheck_module(m, x)


@pytest.mark.parametrize(
    "option, fix",
    [
        ({"window_size": 0}, "window_size must be a positive integer"),
        ({"window_size": 2.5}, "window_size must be a positive integer"),
        ({"scale": "log"}, "log_n"),
        ({"rel_pos": "yes"}, "true or false"),
        ({"scale": "log_n", "grid_size": None}, "inside a vitzoo model or pass grid_size"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(option, fix):
    assert_bad_option("window", option, fix, DIM, HEADS)


def test_double_resolution_in_both_backbones():
    """vit: 4x4 grid at 32 px, 8x8 at 64 px; 3x3 windows, block 1 shifted (windows 1, 3, 3, 1 per axis)."""
    torch.manual_seed(0)
    vit = vitzoo.create_model(
        "vit_tiny",
        attention={"name": "window", "window_size": 3},
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
    )
    resnet = vitzoo.create_model("nonlocal_resnet18_cifar", attention="window", channels=(8, 16, 32, 64), stem_width=8)
    assert [m.shifted for m in vit.modules() if isinstance(m, WindowAttention)] == [False, True]
    expected = {32: ({9 + 1, 3 + 1, 1 + 1}, {9 + 1, 3 + 1, 1 + 1}), 64: ({9 + 1, 6 + 1, 4 + 1}, {9 + 1, 3 + 1, 1 + 1})}
    for px in (32, 64):
        with capture_attention(vit) as maps:
            vit(torch.randn(2, 3, px, px)).square().mean().backward()
        for probs, sizes in zip(maps.values(), expected[px]):
            support = (probs[0, 0] > 0).sum(-1)  # keys each query attends
            assert support[0] == probs.shape[-1] and set(support[1:].tolist()) == sizes
    for model, px in ((vit, 64), (resnet, 64)):
        model.zero_grad()
        model(torch.randn(2, 3, px, px)).square().mean().backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert not any(m.shifted for m in resnet.modules() if isinstance(m, WindowAttention))
