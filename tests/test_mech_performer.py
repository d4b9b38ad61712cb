"""performer (FAVOR+): float64 formula for a given W, stabilisers, the softmax limit as m grows, redraws."""

import math

import pytest
import torch

from vitzoo.attention import build_attention
from vitzoo.attention import functional as AF
from vitzoo.attention.performer import PerformerFeatureMap, orthogonal_gaussian, performer_features

from attention_reference import module_out, module_qkv, single_thread, softmax_ref  # noqa: F401
from mech_checks import build, check_double_resolution, gradcheck_module


def log_features(x, w, scale=None):
    """log(phi(x) sqrt(m)) = W x' - |x'|^2 / 2 with x' = x sqrt(scale), scale 1/sqrt(d) by default."""
    x = x.double() * math.sqrt(x.shape[-1] ** -0.5 if scale is None else scale)
    return x @ w.double().T - (x * x).sum(-1, keepdim=True) / 2


def performer_ref(q, k, v, w, scale=None):
    """A_ij = phi(q_i).phi(k_j) / sum_j phi(q_i).phi(k_j), summed in log space (exact for any size)."""
    lq, lk = log_features(q, w, scale), log_features(k, w, scale)
    logits = torch.logsumexp(lq.unsqueeze(-2) + lk.unsqueeze(-3), dim=-1)
    a = logits.softmax(dim=-1)
    return a @ v.double(), a


def test_orthogonal_gaussian_rows_are_orthogonal_in_blocks_of_d():
    w = orthogonal_gaussian(20, 8, torch.Generator().manual_seed(0)).double()
    assert w.shape == (20, 8)
    for block in (w[:8], w[8:16], w[16:]):
        gram = block @ block.T
        torch.testing.assert_close(gram, torch.diag(gram.diagonal()), atol=1e-5, rtol=0)
    norms = w.norm(dim=1)
    assert norms.std() > 0.1  # Gaussian row lengths (chi with d dof), not unit rows
    assert not torch.allclose(
        w[:8] @ w[8:16].T, torch.zeros(8, 8, dtype=torch.float64), atol=1e-2
    )  # blocks are independent


@pytest.mark.parametrize("heads", [{"heads": "split"}, {"heads": "projected", "head_dim": 5}])
def test_module_is_the_float64_formula_for_its_w(heads):
    attn = build({"name": "performer", "num_features": 32, "eps": 0.0, **heads}, qkv_bias=True).double()
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    expected = module_out(attn, performer_ref(q, k, v, attn.phi.weight)[0])
    torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-12)


def test_stabilisers_keep_large_exponents_finite_in_float32():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) * 30 for _ in range(3))
    w = orthogonal_gaussian(64, 8, g)
    assert (log_features(q, w).float().exp().sum(-1) == 0).all()  # unstabilised, every feature underflows
    fq, fk = performer_features(q, w, True), performer_features(k, w, False)
    out = AF.linear_attention(fq, fk, v, "identity", eps=0.0, impl="eager")
    torch.testing.assert_close(out.double(), performer_ref(q, k, v, w)[0], rtol=1e-4, atol=1e-3)


def test_output_approaches_softmax_attention_as_m_grows():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 32, 8, generator=g) * s for s in (0.5, 0.5, 1.0))  # logits of std 1/4
    exact = softmax_ref(q, k, v)[0]
    errors = {}
    for m in (64, 4096):
        torch.manual_seed(1)
        phi = PerformerFeatureMap(8, num_features=m)
        out = AF.linear_attention(phi(q, True), phi(k, False), v, "identity", eps=0.0, impl="eager")
        errors[m] = float((out.double() - exact).abs().mean())
    assert errors[4096] < errors[64] / 4, errors


def test_gradcheck():
    attn = build(
        {"name": "performer", "num_features": 8, "heads": "projected", "head_dim": 3}, dim=8, tokens=4
    ).double()
    assert gradcheck_module(attn, torch.randn(1, 4, 8, dtype=torch.float64))


def test_redraws_every_interval_in_training_only_and_reproducibly():
    attn = build({"name": "performer", "num_features": 8, "redraw_interval": 2})
    twin = build({"name": "performer", "num_features": 8, "redraw_interval": 2})
    x = torch.randn(1, 16, 16)
    draws = []
    for _ in range(5):
        attn(x)
        draws.append(attn.phi.weight.clone())
    assert torch.equal(draws[0], draws[1]) and torch.equal(draws[2], draws[3])  # steps 0-1, 2-3
    assert not torch.equal(draws[1], draws[2]) and not torch.equal(draws[3], draws[4])
    rng = torch.get_rng_state()
    for _ in range(5):
        twin(x)
    assert torch.equal(twin.phi.weight, draws[-1])  # same seed buffer, same redraws: every process agrees
    assert torch.equal(torch.get_rng_state(), rng)  # redraws leave the global RNG alone
    attn.eval()
    for _ in range(4):
        attn(x)
    assert torch.equal(attn.phi.weight, draws[-1]) and int(attn.phi.step) == 5  # eval never redraws


def test_log_n_scale_is_the_softmax_scale_inside_the_features():
    d, n_train = 8, 16
    attn = build({"name": "performer", "num_features": 32, "scale": "log_n", "eps": 0.0}).double()
    plain = build({"name": "performer", "num_features": 32, "eps": 0.0}).double()
    x = torch.randn(2, n_train, 16, dtype=torch.float64)
    torch.testing.assert_close(attn(x), plain(x))  # the sqrt_d scale at the training token count
    x = torch.randn(2, 49, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    scale = math.sqrt(d) / math.log(n_train) * math.log(49) / d
    expected = module_out(attn, performer_ref(q, k, v, attn.phi.weight, scale)[0])
    torch.testing.assert_close(attn(x), expected, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(attn(x), plain(x))


def test_linear_with_the_performer_feature_map_is_the_mechanism():
    spec = {"name": "performer", "num_features": 16, "redraw_interval": 0}
    fmap = {"name": "linear", "feature_map": {"name": "performer", "num_features": 16, "redraw_interval": 0}}
    x = torch.randn(2, 16, 16)
    torch.testing.assert_close(build(spec)(x), build(fmap)(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "spec, fix",
    [
        ({"name": "performer", "feature_map": "elu"}, "drop feature_map"),
        ({"name": "performer", "num_features": 0}, "num_features must be >= 1"),
        ({"name": "performer", "redraw_interval": -1}, "0 = never"),
        ({"name": "performer", "scale": "log_n"}, "train_tokens"),
        ({"name": "linear", "feature_map": {"name": "performer", "features": 8}}, "num_features"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, fix):
    with pytest.raises(ValueError, match=fix) as err:
        build_attention(spec, 16, num_heads=2)
    assert "\n" not in str(err.value)


def test_at_twice_the_resolution_in_both_backbones():
    check_double_resolution(
        {"name": "performer", "num_features": 16, "eps": 0.0},
        lambda layer, q, k, v: performer_ref(q, k, v, layer.phi.weight)[0],
    )
