"""Agent attention against softmax(Q A^T) softmax(A K^T) V + DWC(V) written from the formula (float64)."""

import math

import pytest
import torch
import torch.nn.functional as F

import vitzoo
from vitzoo.attention.agent import AgentAttention
from vitzoo.diagnostics import capture_attention

from attention_reference import dwc_ref, module_out, module_qkv, single_thread, softmax_ref  # noqa: F401
from mech_checks import assert_bad_option, check_double_resolution, gradcheck_module
from mech_checks import build as build_module

DIM, HEADS, PREFIX, GRID = 8, 2, 1, (4, 6)  # a non-square grid catches h/w mix-ups
N = PREFIX + GRID[0] * GRID[1]


def build(spec, grid=GRID, prefix=PREFIX, seed=0):
    m = build_module({"name": "agent", **spec}, DIM, HEADS, prefix=prefix, seed=seed, grid=grid, qkv_bias=True).double()
    m.token_grid = grid
    return m


def ref_agents(q, agents, grid=GRID, prefix=PREFIX):
    """Agents as block means of the patch queries (the grid divisible by the agent grid)."""
    B, H, _, D = q.shape
    (ah, aw), (gh, gw) = agents, grid
    blocks = q[:, :, prefix:].reshape(B, H, ah, gh // ah, aw, gw // aw, D)
    return blocks.mean(dim=(3, 5)).reshape(B, H, ah * aw, D)


def resized(t, size, dims):
    """Axes ``dims`` (one: linear, two: bilinear, half-pixel centres) of ``t`` resized to ``size``."""
    t = t.detach().double()
    if tuple(t.shape[d] for d in dims) == tuple(size):
        return t
    moved = t.movedim(dims, tuple(range(-len(dims), 0)))
    flat = moved.reshape(1, -1, *moved.shape[-len(dims) :])
    out = F.interpolate(flat, size=tuple(size), mode="linear" if len(dims) == 1 else "bilinear", align_corners=False)
    return out.reshape(*moved.shape[: -len(dims)], *size).movedim(tuple(range(-len(dims), 0)), dims)


def ref_biases(m, grid):
    """The official AgentAttention's biases (agent_deit.py), in float64, generalised to an h x w grid and P prefix
    tokens: B_a = [ac | interp(an) + ah + aw] (H, n_a, P + hw), B_q = [ca ; interp(na)^T + ha + wa] (H, P + hw, n_a);
    at another grid than the built one the row / column tables are resized linearly along their grid axis."""
    b, (h, w) = m.bias, grid
    H, n_a = b.an.shape[:2]
    to_tokens = (
        resized(b.an, grid, (2, 3)) + resized(b.ah, (h,), (2,))[..., None] + resized(b.aw, (w,), (2,))[..., None, :]
    ).reshape(H, n_a, h * w)
    to_agents = resized(b.na, grid, (2, 3)).reshape(H, n_a, h * w).transpose(1, 2) + (
        resized(b.ha, (h,), (1,))[:, :, None] + resized(b.wa, (w,), (1,))[:, None]
    ).reshape(H, h * w, n_a)
    return torch.cat([b.ca.double(), to_agents], 1), torch.cat([b.ac.double(), to_tokens], -1)


def ref_agent(m, x, agents, scales=(None, None), grid=GRID, prefix=PREFIX):
    """(output of the module, implied matrix) from the formula."""
    q, k, v = module_qkv(m, x)
    a = ref_agents(q, agents, grid, prefix)
    query_bias, agent_bias = (None, None) if m.bias is None else ref_biases(m, grid)
    agent_v, attn_a = softmax_ref(a, k, v, scale=scales[1], mask=agent_bias)
    out, attn_q = softmax_ref(q, a, agent_v, scale=scales[0], mask=query_bias)
    out = out + dwc_ref(v, m.dwc, grid, prefix)
    return module_out(m, out), attn_q @ attn_a


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel_size", [0, 3, 5])
def test_output_and_implied_matrix_match_the_formula(kernel_size, bias):
    m = build({"num_agents": 4, "kernel_size": kernel_size, "bias": bias})
    with torch.no_grad():
        m.dwc is None or m.dwc.bias.normal_()
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    out, implied = ref_agent(m, x, (2, 2))
    torch.testing.assert_close(m(x), out, rtol=1e-10, atol=1e-10)
    q, k, _ = m.project(x)
    index = torch.tensor([0, 3, N - 1])
    p = m.probs(x, q, k, None, False, index)
    torch.testing.assert_close(p, implied[:, :, index], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, HEADS, 3, dtype=torch.float64))


def test_log_n_scales_count_agents_and_tokens():
    """Each softmax counts its own keys: n_a (constant here) in softmax(Q A^T), N in softmax(A K^T)."""
    m = build({"num_agents": 4, "kernel_size": 0, "scale": "log_n"}, grid=(2, 3))  # trained at 4 agents, 7 tokens
    m.token_grid = GRID
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    d = DIM // HEADS
    scales = (math.sqrt(d) / math.log(4) * math.log(4) / d, math.sqrt(d) / math.log(7) * math.log(N) / d)
    torch.testing.assert_close(m(x), ref_agent(m, x, (2, 2), scales)[0], rtol=1e-10, atol=1e-10)
    assert scales[0] == pytest.approx(d**-0.5) and scales[1] > d**-0.5


def test_one_agent_gives_every_token_the_mean_query_attention():
    """n_a = 1: softmax over one agent is 1, so each row is softmax(mean(q_patch) K^T / sqrt(d)) V."""
    m = build({"num_agents": 1, "kernel_size": 0, "bias": False})
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    q, k, v = module_qkv(m, x)
    row = softmax_ref(q[:, :, PREFIX:].mean(dim=2, keepdim=True), k, v)[0]
    torch.testing.assert_close(m(x), module_out(m, row.expand(-1, -1, N, -1)), rtol=1e-10, atol=1e-10)


def test_a_grid_smaller_than_the_agent_grid_makes_every_patch_query_an_agent():
    m49, m_all = build({"num_agents": 49, "bias": False}), build({"num_agents": 36, "bias": False})  # clip to 4x6
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    torch.testing.assert_close(m49(x), m_all(x), rtol=0, atol=0)
    q, k, _ = module_qkv(m49, x)
    a = q[:, :, PREFIX:]
    implied = softmax_ref(q, a, a)[1] @ softmax_ref(a, k, k)[1]
    torch.testing.assert_close(m49.probs(x, *m49.project(x)[:2], None, False, torch.arange(N)), implied)


def test_gradcheck():
    m = build({"num_agents": 4, "kernel_size": 3, "heads": "projected", "head_dim": 3}, grid=(2, 3))
    x = torch.randn(1, PREFIX + 6, DIM, dtype=torch.float64, requires_grad=True)
    assert gradcheck_module(m, x)


@pytest.mark.parametrize(
    "option, fix",
    [
        ({"num_agents": 50}, "perfect square.*num_agents: 49"),
        ({"num_agents": 0}, "perfect square"),
        ({"kernel_size": 4}, "must be odd"),
        ({"scale": "log"}, "log_n"),
        ({"scale": "log_n", "grid_size": None}, "inside a vitzoo model or pass grid_size"),
        ({"grid_size": None}, "set bias: false"),
        ({"bias": "yes"}, "true or false"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(option, fix):
    assert_bad_option("agent", option, fix, DIM, HEADS)


def test_double_resolution_in_both_backbones():
    torch.manual_seed(0)
    vit = vitzoo.create_model(
        "vit_tiny", attention="agent", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2
    )
    resnet = vitzoo.create_model("nonlocal_resnet18_cifar", attention="agent", channels=(8, 16, 32, 64), stem_width=8)
    for model, px, tokens in ((vit, 32, 17), (vit, 64, 65), (resnet, 64, 32 * 32)):
        model.zero_grad()
        with capture_attention(model, max_queries=4) as maps:
            model(torch.randn(2, 3, px, px)).square().mean().backward()
        assert next(iter(maps.values())).shape[-2:] == (4, tokens)  # the first (ViT) or largest (ResNet) layer
        assert all(torch.isfinite(p).all() and torch.allclose(p.sum(-1), torch.ones(())) for p in maps.values())
        layers = [m for m in model.modules() if isinstance(m, AgentAttention)]
        assert layers and all(torch.isfinite(m.dwc.weight.grad).all() for m in layers)
    assert [m.current_grid(65) for m in vit.modules() if isinstance(m, AgentAttention)] == [(8, 8)] * 2


@pytest.mark.parametrize("prefix", [0, 2])
def test_the_biases_are_the_official_tables_at_a_square_grid(prefix):
    """The official layout (square grid, 7x7 agents on a 14x14 grid resize the 7x7 tables) with 0 or 2 prefix
    tokens, each prefix token its own bias entries."""
    grid, agents = (14, 14), (7, 7)
    m = build({"num_agents": 49, "kernel_size": 3}, grid=grid, prefix=prefix)
    x = torch.randn(1, prefix + 196, DIM, dtype=torch.float64)
    torch.testing.assert_close(m(x), ref_agent(m, x, agents, grid=grid, prefix=prefix)[0], rtol=1e-10, atol=1e-10)


def test_a_state_dict_from_another_grid_resizes_the_row_and_column_tables():
    small = build({"num_agents": 4}, grid=(4, 6))
    large = build({"num_agents": 4}, grid=(8, 12), seed=1)
    large.load_state_dict(small.state_dict())
    for name, dims, size in (("ah", (2,), (8,)), ("aw", (2,), (12,)), ("ha", (1,), (8,)), ("wa", (1,), (12,))):
        torch.testing.assert_close(getattr(large.bias, name), resized(getattr(small.bias, name), size, dims))
    torch.testing.assert_close(large.bias.an, small.bias.an)


def test_clipped_agents_resize_the_agent_axis_of_the_biases():
    """On a 4x6 grid 5x5 agents clip to 4x5: the agent axis of
    each table is the side x side one resized to the agent grid."""
    m = build({"num_agents": 25})
    query_bias, agent_bias = m.biases(GRID)
    full = m.bias(GRID, (5, 5))
    torch.testing.assert_close(agent_bias, resized(full[1].unflatten(1, (5, 5)), (4, 5), (1, 2)).flatten(1, 2))
    torch.testing.assert_close(query_bias, resized(full[0].unflatten(2, (5, 5)), (4, 5), (2, 3)).flatten(2, 3))


def test_at_twice_the_resolution_in_both_backbones_with_the_biases():
    """2x2 agents: the doubled grid resizes the bias tables, the reference resizes them as the official 7x7 ones."""

    def reference(layer, q, k, v):
        grid, prefix = layer.token_grid, layer.num_prefix_tokens
        a = ref_agents(q, (2, 2), grid, prefix)
        query_bias, agent_bias = ref_biases(layer, grid)
        agent_v = softmax_ref(a, k, v, mask=agent_bias)[0]
        return softmax_ref(q, a, agent_v, mask=query_bias)[0] + dwc_ref(v, layer.dwc, grid, prefix)

    check_double_resolution({"name": "agent", "num_agents": 4}, reference)
