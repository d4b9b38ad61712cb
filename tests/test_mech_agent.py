"""Agent attention against softmax(Q A^T) softmax(A K^T) V + DWC(V) written from the formula (float64)."""
import math

import pytest
import torch

import vitzoo
from vitzoo.attention import build_attention
from vitzoo.attention.agent import AgentAttention
from vitzoo.diagnostics import capture_attention

from attention_reference import dwc_ref, module_out, module_qkv, single_thread, softmax_ref  # noqa: F401
from mech_checks import assert_one_line_error, gradcheck_module

DIM, HEADS, PREFIX, GRID = 8, 2, 1, (4, 6)  # a non-square grid catches h/w mix-ups
N = PREFIX + GRID[0] * GRID[1]


def build(spec, grid=GRID, prefix=PREFIX, seed=0):
    torch.manual_seed(seed)
    m = build_attention({"name": "agent", **spec}, DIM, num_heads=HEADS, qkv_bias=True,
                        num_tokens=prefix + grid[0] * grid[1], num_prefix_tokens=prefix, grid_size=grid).double()
    m.token_grid = grid
    return m


def ref_agents(q, agents):
    """Agents as block means of the patch queries (the grid divisible by the agent grid)."""
    B, H, _, D = q.shape
    (ah, aw), (gh, gw) = agents, GRID
    blocks = q[:, :, PREFIX:].reshape(B, H, ah, gh // ah, aw, gw // aw, D)
    return blocks.mean(dim=(3, 5)).reshape(B, H, ah * aw, D)


def ref_agent(m, x, agents, scales=(None, None)):
    """(output of the module, implied matrix) from the formula."""
    q, k, v = module_qkv(m, x)
    a = ref_agents(q, agents)
    agent_v, attn_a = softmax_ref(a, k, v, scale=scales[1])
    out, attn_q = softmax_ref(q, a, agent_v, scale=scales[0])
    out = out + dwc_ref(v, m.dwc, GRID, PREFIX)
    return module_out(m, out), attn_q @ attn_a


@pytest.mark.parametrize("kernel_size", [0, 3, 5])
def test_output_and_implied_matrix_match_the_formula(kernel_size):
    m = build({"num_agents": 4, "kernel_size": kernel_size})
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
    assert scales[0] == pytest.approx(d ** -0.5) and scales[1] > d ** -0.5


def test_one_agent_gives_every_token_the_mean_query_attention():
    """n_a = 1: softmax over one agent is 1, so each row is softmax(mean(q_patch) K^T / sqrt(d)) V."""
    m = build({"num_agents": 1, "kernel_size": 0})
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    q, k, v = module_qkv(m, x)
    row = softmax_ref(q[:, :, PREFIX:].mean(dim=2, keepdim=True), k, v)[0]
    torch.testing.assert_close(m(x), module_out(m, row.expand(-1, -1, N, -1)), rtol=1e-10, atol=1e-10)


def test_a_grid_smaller_than_the_agent_grid_makes_every_patch_query_an_agent():
    m49, m_all = build({"num_agents": 49}), build({"num_agents": 36})  # 7x7 and 6x6 clip to the 4x6 grid
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


@pytest.mark.parametrize("option, fix", [
    ({"num_agents": 50}, "perfect square.*num_agents: 49"),
    ({"num_agents": 0}, "perfect square"),
    ({"kernel_size": 4}, "must be odd"),
    ({"scale": "log"}, "log_n"),
    ({"scale": "log_n", "grid_size": None}, "inside a vitzoo model or pass grid_size"),
])
def test_bad_options_are_one_line_naming_the_fix(option, fix):
    option = dict(option)
    grid = option.pop("grid_size", (4, 4))
    assert_one_line_error({"name": "agent", **option}, fix, DIM, HEADS, grid)


def test_double_resolution_in_both_backbones():
    torch.manual_seed(0)
    vit = vitzoo.create_model("vit_tiny", attention="agent", img_size=32, patch_size=8, embed_dim=32, depth=2,
                              num_heads=2)
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
