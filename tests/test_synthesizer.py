"""Synthesizer family: each variant against softmax(B) V written from the formula (float64)."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

import vitzoo
from vitzoo.attention import SynthRandomAttention, attention_options, build_attention
from vitzoo.models import NonLocalBlock

DIM, HEADS, PREFIX, GRID = 16, 2, 1, (3, 4)  # a non-square grid catches h/w mix-ups
N = PREFIX + GRID[0] * GRID[1]
HD = DIM // HEADS
ALL_PARTS = ["dense", "random", "factorized_dense", "factorized_random", "softmax"]
VARIANTS = {
    "dense": {"name": "synth_dense"},
    "random": {"name": "synth_random"},
    "random_fixed": {"name": "synth_random", "trainable": False},
    "factorized_dense": {"name": "synth_factorized_dense"},
    "factorized_random": {"name": "synth_factorized_random", "rank": 3},
    "mix": {"name": "synth_mix", "parts": ALL_PARTS},
}


def build(spec, grid=GRID, prefix=PREFIX, seed=0, **kw):
    torch.manual_seed(seed)
    m = build_attention(
        spec,
        DIM,
        num_heads=HEADS,
        num_tokens=prefix + grid[0] * grid[1],
        num_prefix_tokens=prefix,
        grid_size=grid,
        **kw,
    ).double()
    with torch.no_grad():  # random (nonzero) biases and mixture weights
        for name, p in m.named_parameters():
            if name.endswith("bias") or name.endswith("synth.weight"):
                p.normal_()
    return m


# -- float64 references written from the formulas ------------------------------------------------
def ref_dense_rows(fc1, fc2, x):
    """relu(x W1 + b1) W2 + b2 as (B, H, N, width)."""
    h = torch.relu(x @ fc1.weight.T + fc1.bias)
    return (h @ fc2.weight.T + fc2.bias).view(x.shape[0], x.shape[1], HEADS, -1).permute(0, 2, 1, 3)


def ref_part_logits(kind, gen, x, q, k):
    if kind == "dense":
        return ref_dense_rows(gen.fc1, gen.fc2, x)
    if kind == "random":
        return gen.weight[None]
    if kind == "factorized_dense":
        a, b = GRID
        rows = ref_dense_rows(gen.fc1, gen.fc2, x)
        pre, b1, b2 = rows[..., :PREFIX], rows[..., PREFIX : PREFIX + a], rows[..., PREFIX + a :]
        # H_A repeats each entry of B1 b times, H_B tiles B2 a times: one grid key (r, c) per pair
        return torch.cat([pre, b1.repeat_interleave(b, dim=-1) * b2.repeat(1, 1, 1, a)], dim=-1)
    if kind == "factorized_random":
        return (gen.r1 @ gen.r2.transpose(-2, -1))[None]
    assert kind == "softmax"
    return q @ k.transpose(-2, -1) / math.sqrt(HD)


def ref_qkv(m, x):
    """Split-head projections: in_proj rows are (outputs, heads, head_dim)."""
    w = m.in_proj.proj.weight.view(-1, m.num_heads, m.head_dim, x.shape[-1])
    bias = m.in_proj.proj.bias
    b = bias.view(-1, 1, m.num_heads, 1, m.head_dim) if bias is not None else torch.zeros(len(w), 1, 1, 1, 1)
    return [torch.einsum("bnc,hdc->bhnd", x, wi) + bi for wi, bi in zip(w, b)]


def ref_logits(m, x):
    *qk, _ = ref_qkv(m, x)
    q, k = qk if qk else (None, None)
    if hasattr(m.synth, "parts"):
        alpha = torch.exp(m.synth.weight) / torch.exp(m.synth.weight).sum()
        return sum(a * ref_part_logits(kind, gen, x, q, k) for a, (kind, gen) in zip(alpha, m.synth.parts.items()))
    kind = {
        "DenseLogits": "dense",
        "RandomLogits": "random",
        "FactorizedDenseLogits": "factorized_dense",
        "FactorizedRandomLogits": "factorized_random",
    }[type(m.synth).__name__]
    return ref_part_logits(kind, m.synth, x, q, k)


def ref_output(m, x, logits):
    v = ref_qkv(m, x)[-1]
    a = torch.exp(logits - logits.amax(-1, keepdim=True))
    out = (a / a.sum(-1, keepdim=True)) @ v
    return out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1) @ m.proj.weight.T + m.proj.bias


@pytest.mark.parametrize("variant", VARIANTS)
def test_output_is_softmax_of_the_formula_times_v(variant):
    m = build(VARIANTS[variant])
    for batch in (1, 3):
        x = torch.randn(batch, N, DIM, dtype=torch.float64)
        torch.testing.assert_close(m(x), ref_output(m, x, ref_logits(m, x)), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", VARIANTS)
def test_probs_rows_are_distributions_matching_the_formula(variant):
    m = build(VARIANTS[variant])
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    q, k, _ = m.project(x)
    index = torch.tensor([0, 5, N - 1])
    p = m.probs(x, q, k, None, False, index)
    assert p.shape == (2, HEADS, 3, N)
    assert (p >= 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(2, HEADS, 3, dtype=torch.float64))
    torch.testing.assert_close(p, ref_logits(m, x).softmax(-1).expand(2, -1, -1, -1)[:, :, index])


def test_projected_heads_and_causal_mask():
    m = build({"name": "synth_dense", "heads": "projected", "head_dim": 5})
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    assert m(x).shape == (2, N, DIM)
    q, k, _ = m.project(x)
    p = m.probs(x, q, k, None, True, torch.arange(N))
    assert torch.equal(p.triu(1), torch.zeros_like(p))
    torch.testing.assert_close(p.sum(-1), torch.ones(2, HEADS, N, dtype=torch.float64))


# -- permutations: what is (and is not) equivariant ------------------------------------------------
def test_random_is_input_independent_and_not_permutation_equivariant():
    m = build(VARIANTS["random"])
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    q, k, _ = m.project(x)
    p = m.probs(x, q, k, None, False, torch.arange(N))
    p_perm = m.probs(x[:, perm], q, k, None, False, torch.arange(N))
    assert torch.equal(p, p_perm)  # B = R does not look at the tokens
    assert not torch.allclose(m(x[:, perm]), m(x)[:, perm], atol=1e-3)


def test_dense_rows_follow_the_tokens_but_keys_stay_at_absolute_positions():
    m = build(VARIANTS["dense"])
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    idx = torch.arange(N)
    p = m.probs(x, None, None, None, False, idx)
    p_perm = m.probs(x[:, perm], None, None, None, False, idx)
    torch.testing.assert_close(p_perm, p[:, :, perm])  # row i is predicted by token i alone
    assert not torch.allclose(p_perm, p[:, :, perm][..., perm], atol=1e-3)  # columns do not move with it
    assert not torch.allclose(m(x[:, perm]), m(x)[:, perm], atol=1e-3)


# -- trainable vs fixed, mixture weights ------------------------------------------------------------
def test_fixed_random_gets_no_update_but_is_saved():
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    for trainable in (True, False):
        m = build({"name": "synth_random", "trainable": trainable})
        before = m.synth.weight.detach().clone()
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        m(x).square().sum().backward()
        opt.step()
        assert ("synth.weight" in dict(m.named_parameters())) is trainable
        assert "synth.weight" in m.state_dict()
        assert torch.equal(m.synth.weight, before) is not trainable
    other = build({"name": "synth_random", "trainable": False}, seed=123)
    assert not torch.equal(other.synth.weight, m.synth.weight)
    other.load_state_dict(m.state_dict())
    assert torch.equal(other(x), m(x))


def test_mix_weights_on_simplex_and_q_k_only_with_softmax_part():
    m = build({"name": "synth_mix", "parts": ["random", "softmax"]})
    with torch.no_grad():
        m.synth.weight.copy_(torch.tensor([3.0, -40.0]))
    alpha = m.synth.alpha
    assert (alpha >= 0).all() and abs(float(alpha.detach().sum()) - 1) < 1e-12
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    m(x).sum().backward()
    assert m.synth.weight.grad.abs().sum() > 0
    assert m.in_proj.proj.out_features == 3 * DIM
    assert build({"name": "synth_mix", "parts": ["random", "dense"]}).in_proj.proj.out_features == DIM


# -- logit noise ---------------------------------------------------------------------------------
def test_zero_noise_is_bit_identical_and_draws_nothing():
    m = build(VARIANTS["mix"]).eval()
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    clean = m(x)
    m.train()
    state = torch.get_rng_state()
    assert torch.equal(m(x), clean)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("variant", ["random", "dense"])
def test_noise_is_gaussian_on_the_logits_in_training(variant):
    sigma = 0.7
    m = build({**VARIANTS[variant], "logit_noise": sigma})
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    torch.manual_seed(5)
    noisy = m(x)
    torch.manual_seed(5)
    eps = torch.randn(2, HEADS, N, N, dtype=torch.float64)
    torch.testing.assert_close(noisy, ref_output(m, x, ref_logits(m, x) + sigma * eps))
    m.eval()
    clean = m(x)
    torch.testing.assert_close(clean, ref_output(m, x, ref_logits(m, x)))
    m.eval_logit_noise = sigma
    assert not torch.allclose(m(x), clean, atol=1e-4)


# -- resolution changes -----------------------------------------------------------------------------
def ref_resample_last(t, src, dst):
    """Prefix entries kept, grid entries bilinear (align_corners=False) on the last axis."""
    pre, grid = t[..., :PREFIX], t[..., PREFIX:]
    lead = grid.shape[:-1]
    grid = F.interpolate(grid.reshape(-1, 1, *src), size=dst, mode="bilinear", align_corners=False)
    return torch.cat([pre, grid.reshape(*lead, -1)], dim=-1)


def test_interpolate_false_refuses_a_new_token_count():
    m = build({"name": "synth_random", "interpolate": False})
    m.token_grid = (5, 6)
    with pytest.raises(ValueError, match=r"built for 13 tokens.*got 31.*interpolate: true"):
        m(torch.randn(1, 31, DIM, dtype=torch.float64))


def test_interpolated_random_and_dense_logits_match_bilinear_grids():
    new = (5, 6)
    n_new = PREFIX + new[0] * new[1]
    x = torch.randn(2, n_new, DIM, dtype=torch.float64)
    rand = build(VARIANTS["random"])
    rand.token_grid = new
    want = ref_resample_last(ref_resample_last(rand.synth.weight, GRID, new).transpose(-1, -2), GRID, new)
    want = want.transpose(-1, -2)[None]  # both axes resampled
    torch.testing.assert_close(want[..., :PREFIX, :PREFIX], rand.synth.weight[None, :, :PREFIX, :PREFIX])
    out = rand(x)
    assert out.shape == (2, n_new, DIM)
    torch.testing.assert_close(out, ref_output(rand, x, want))

    dense = build(VARIANTS["dense"])
    dense.token_grid = new
    want = ref_resample_last(ref_dense_rows(dense.synth.fc1, dense.synth.fc2, x), GRID, new)  # key axis only
    torch.testing.assert_close(dense(x), ref_output(dense, x, want))


@pytest.mark.parametrize("variant", VARIANTS)
def test_interpolate_at_the_built_grid_is_exactly_the_plain_result(variant):
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    plain = build({**VARIANTS[variant], "interpolate": False})
    interp = build(VARIANTS[variant])
    interp.load_state_dict(plain.state_dict())
    interp.token_grid = GRID
    assert torch.equal(interp(x), plain(x))
    interp.token_grid = (4, 3)  # same count, other grid: resampled
    assert not torch.allclose(interp(x), plain(x), atol=1e-6)


def test_interpolate_false_refuses_another_grid_of_the_same_size():
    plain = build({**VARIANTS["random"], "interpolate": False})
    plain.token_grid = (4, 3)  # 12 grid tokens like the built 3 x 4, but transposed
    with pytest.raises(
        ValueError, match="built for 1 prefix \\+ 3x4 grid but got 1 prefix \\+ 4x3 grid.*interpolate: true"
    ):
        plain(torch.randn(1, N, DIM, dtype=torch.float64))


def test_vit_tells_its_layers_the_grid_height_first():
    """A 48 x 32 input to a ViT built for 32 x 32 (patch 4): a (12, 8) grid, resampled bilinearly."""
    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", attention="synth_random", depth=1).double().eval()
    layer = model.blocks[0].attn
    seen = {}
    layer.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    with torch.no_grad():
        model(torch.randn(1, 3, 48, 32, dtype=torch.float64))
    assert layer.token_grid == (12, 8)
    want = ref_resample_last(ref_resample_last(layer.synth.weight, (8, 8), (12, 8)).transpose(-1, -2), (8, 8), (12, 8))
    with torch.no_grad():
        torch.testing.assert_close(layer(seen["x"]), ref_output(layer, seen["x"], want.transpose(-1, -2)[None]))


# -- backbones --------------------------------------------------------------------------------------
MODEL_SPECS = [
    {"name": "synth_dense", "hidden": 32},
    "synth_random",
    {"name": "synth_random", "trainable": False},
    "synth_factorized_dense",
    "synth_factorized_random",
    {"name": "synth_mix", "parts": ALL_PARTS},
]


@pytest.mark.parametrize("spec", MODEL_SPECS, ids=str)
def test_vit_forward_backward_at_two_resolutions(spec):
    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", attention=spec, depth=2)
    for px in (32, 48):
        model.zero_grad()
        out = model(torch.randn(2, 3, px, px))
        assert out.shape == (2, 10)
        out.square().mean().backward()
        synth_grads = [p.grad for n, p in model.named_parameters() if ".synth." in n]
        assert all(g is not None and torch.isfinite(g).all() for g in synth_grads)
        assert any(g.abs().sum() > 0 for g in synth_grads) or not synth_grads


def test_vit_without_interpolation_names_the_option():
    model = vitzoo.create_model("vit_cifar", attention={"name": "synth_dense", "interpolate": False}, depth=1)
    model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match=r"65 tokens.*got 145.*interpolate: true"):
        model(torch.randn(1, 3, 48, 48))


@pytest.mark.parametrize("spec", MODEL_SPECS, ids=str)
def test_state_dict_from_another_grid_is_resampled_on_load(spec):
    torch.manual_seed(0)
    small = vitzoo.create_model("vit_cifar", attention=spec, depth=2).eval()
    big = vitzoo.create_model("vit_cifar", attention=spec, depth=2, img_size=64).eval()
    state = small.state_dict()
    state["pos_embed"] = resample_abs_pos_embed(
        state["pos_embed"], new_size=(16, 16), old_size=(8, 8), num_prefix_tokens=1
    )
    big = copy.deepcopy(big)  # the load hook must survive a copy (timm EMA, Lightning)
    big.load_state_dict(state)
    layouts = [b for n, b in big.named_buffers() if n.endswith("layout")]
    assert layouts and all(b.tolist() == [1, 16, 16] for b in layouts)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(big(x), small(x), rtol=1e-4, atol=1e-5)  # = the small model run at 64 px


def test_nonlocal_block_with_synthesizer_at_two_resolutions():
    block = NonLocalBlock(8, attention="synth_factorized_dense", grid_size=(4, 4))  # no prefix tokens
    assert block.attn.built_layout == (0, 4, 4)
    for side in (4, 6):
        block(torch.randn(2, 8, side, side)).sum().backward()
        assert block.attn.target_layout(side * side) == (0, side, side)


# -- build errors ----------------------------------------------------------------------------------
def test_build_errors_name_the_fix():
    with pytest.raises(ValueError, match="num_tokens"):
        build_attention("synth_random", DIM, num_heads=HEADS)
    with pytest.raises(ValueError, match=r"unknown synth_mix part.*'linear'.*factorized_random"):
        build({"name": "synth_mix", "parts": ["random", "linear"]})
    with pytest.raises(ValueError, match=r"factors=\[2, 5\].*factors: \[3, 4\]"):
        build({"name": "synth_factorized_dense", "factors": [2, 5]})
    with pytest.raises(ValueError, match="rank"):
        build({"name": "synth_factorized_random", "rank": 0})
    with pytest.raises(ValueError, match="scale"):
        build({"name": "synth_mix", "scale": "cubic"})
    assert {"trainable", "interpolate", "logit_noise"} <= set(attention_options(SynthRandomAttention))
    assert "rank" not in attention_options(SynthRandomAttention)


def test_custom_factors_compute_the_outer_product():
    m = build({"name": "synth_factorized_dense", "factors": [2, 6]})
    x = torch.randn(1, N, DIM, dtype=torch.float64)
    rows = ref_dense_rows(m.synth.fc1, m.synth.fc2, x)
    pre, b1, b2 = rows[..., :PREFIX], rows[..., PREFIX : PREFIX + 2], rows[..., PREFIX + 2 :]
    grid = torch.einsum("bhnr,bhnc->bhnrc", b1, b2).flatten(-2)
    torch.testing.assert_close(m(x), ref_output(m, x, torch.cat([pre, grid], -1)))


@pytest.mark.parametrize("variant", ["mix", "dense", "factorized_random"])
def test_gradcheck_through_the_logit_generators(variant):
    """Analytic gradients of the whole module (input and every parameter) match finite differences."""
    m = build(VARIANTS[variant], grid=(2, 2), prefix=1)
    x = torch.randn(1, 5, DIM, dtype=torch.float64, requires_grad=True)
    params = [p for p in m.parameters() if p.requires_grad]

    def fn(x, *values):
        return torch.func.functional_call(
            m, dict(zip([n for n, p in m.named_parameters() if p.requires_grad], values)), (x,)
        )

    assert torch.autograd.gradcheck(fn, (x, *params), fast_mode=True)
