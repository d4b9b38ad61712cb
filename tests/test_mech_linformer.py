"""Linformer against a float64 reference written from the formula (docs/mechanisms.md, section 9)."""

import pytest
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

import vitzoo
from vitzoo.attention import build_attention

from attention_reference import module_out, module_qkv, single_thread, softmax_ref  # noqa: F401
from mech_checks import backward_at_both_resolutions, gradcheck_module
from mech_checks import build as build_module

DIM, HEADS, PREFIX, GRID, K = 16, 2, 1, (3, 4), 5  # a non-square grid catches h/w mix-ups
N = PREFIX + GRID[0] * GRID[1]


def build(grid=GRID, seed=0, **options):
    spec = {"name": "linformer", "proj_len": K, **options}
    return build_module(spec, DIM, HEADS, prefix=PREFIX, seed=seed, grid=grid, qkv_bias=True).double()


# -- float64 reference -------------------------------------------------------------------------------
def ref_resized(e, src, dst):
    """E's prefix columns kept; its grid columns bilinear (align_corners=False) times |src| / |dst| grid tokens."""
    grid = F.interpolate(e[:, PREFIX:].reshape(1, -1, *src), size=dst, mode="bilinear", align_corners=False)
    return torch.cat([e[:, :PREFIX], grid.reshape(e.shape[0], -1) * (src[0] * src[1]) / (dst[0] * dst[1])], -1)


def ref_module(m, x, e, f, noise=None):
    """(output, implied matrix): softmax(Q (E K)^T / sqrt(d) + noise) (F V)."""
    q, k, v = module_qkv(m, x)
    out, attn = softmax_ref(q, e @ k, f @ v, noise=noise)
    return module_out(m, out), attn @ f


def weights(m):
    return m.e.weight.detach(), m.f.weight.detach()


# -- the formula -------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"heads": "projected", "head_dim": 4}], ids=str)
def test_module_matches_the_reference(options):
    m = build(**options)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    want, implied = ref_module(m, x, *weights(m))
    torch.testing.assert_close(m(x), want, rtol=1e-10, atol=1e-10)
    q, k, _ = m.project(x)
    index = torch.tensor([0, 5, N - 1])
    share = implied.abs() / implied.abs().sum(dim=-1, keepdim=True)  # each token's share of the absolute weight
    torch.testing.assert_close(m.probs(x, q, k, None, False, index), share[:, :, index], rtol=1e-10, atol=1e-10)


def test_logit_noise_on_the_n_by_k_logits_in_training_only():
    sigma = 0.5
    m = build(logit_noise=sigma)
    x = torch.randn(2, N, DIM, dtype=torch.float64)
    torch.manual_seed(3)
    noisy = m(x)
    torch.manual_seed(3)
    noise = torch.randn(2, HEADS, N, K, dtype=torch.float64) * sigma
    torch.testing.assert_close(noisy, ref_module(m, x, *weights(m), noise=noise)[0], rtol=1e-10, atol=1e-10)
    m.eval()
    state = torch.get_rng_state()
    torch.testing.assert_close(m(x), ref_module(m, x, *weights(m))[0], rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.get_rng_state(), state)


def test_gradcheck():
    m = build(grid=(2, 2))
    x = torch.randn(1, 5, DIM, dtype=torch.float64, requires_grad=True)
    assert gradcheck_module(m, x, fast_mode=True)


# -- another resolution ----------------------------------------------------------------------------
def test_interpolation_at_twice_the_grid():
    m = build()
    big = (2 * GRID[0], 2 * GRID[1])
    m.token_grid = big
    x = torch.randn(2, PREFIX + big[0] * big[1], DIM, dtype=torch.float64)
    e, f = (ref_resized(w, GRID, big) for w in weights(m))
    torch.testing.assert_close(m(x), ref_module(m, x, e, f)[0], rtol=1e-10, atol=1e-10)

    # mass kept: F applied to values constant over the grid (any prefix value) is the same at both grids
    def flat(grid):
        return torch.cat([torch.tensor([7.0]), torch.ones(grid[0] * grid[1])]).double()

    torch.testing.assert_close(m.f(m.built_layout) @ flat(GRID), f @ flat(big), rtol=1e-12, atol=1e-12)


def test_interpolate_false_refuses_another_grid():
    m = build(interpolate=False)
    m.token_grid = (6, 8)
    with pytest.raises(
        ValueError,
        match=r"built for 13 tokens.*got 49; set interpolate: true to resample its "
        r"projections E, F",
    ):
        m(torch.randn(1, 49, DIM, dtype=torch.float64))
    m.token_grid = (4, 3)  # the same count, transposed
    with pytest.raises(ValueError, match=r"built for 1 prefix \+ 3x4 grid but got 1 prefix \+ 4x3 grid"):
        m(torch.randn(1, N, DIM, dtype=torch.float64))


def test_state_dict_from_another_grid_is_resampled_on_load():
    """A model built at 64 px loading a 32 px state computes what the 32 px model computes at 64 px."""
    kw = dict(attention={"name": "linformer", "proj_len": 8}, patch_size=8, embed_dim=32, depth=1, num_heads=2)
    torch.manual_seed(0)
    small = vitzoo.create_model("vit_tiny", img_size=32, **kw).eval()
    big = vitzoo.create_model("vit_tiny", img_size=64, **kw).eval()
    state = small.state_dict()
    state["pos_embed"] = resample_abs_pos_embed(
        state["pos_embed"], new_size=(8, 8), old_size=(4, 4), num_prefix_tokens=1
    )
    big.load_state_dict(state)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(big(x), small(x), rtol=1e-4, atol=1e-5)


def test_vit_and_nonlocal_resnet_at_twice_the_resolution():
    spec = {"name": "linformer", "proj_len": 8}
    for model in backward_at_both_resolutions(spec):
        grads = [p.grad for n, p in model.named_parameters() if n.endswith((".e.weight", ".f.weight"))]
        assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


# -- errors ------------------------------------------------------------------------------------------
def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="proj_len.*positive integer"):
        build(proj_len=0)
    with pytest.raises(ValueError, match="only scale: sqrt_d applies"):
        build(scale="log_n")
    with pytest.raises(ValueError, match="num_tokens"):
        build_attention("linformer", DIM, num_heads=HEADS)
