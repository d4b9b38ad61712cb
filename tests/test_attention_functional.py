"""vitzoo.attention.functional against float64 references written from docs/mechanisms.md."""

import math

import pytest
import torch

from vitzoo.attention import functional as AF

from attention_reference import efficient_ref, kernel_ref, single_thread, softmax_ref  # noqa: F401

# (B, H, Nq, Nk, D, Dv): awkward sizes, a single key, queries != keys, value width != head width.
SHAPES = [(1, 1, 1, 1, 1, 1), (2, 3, 5, 7, 4, 6), (1, 2, 17, 17, 8, 8), (3, 1, 9, 4, 16, 2)]
SELF_SHAPES = [s for s in SHAPES if s[2] == s[3]] + [(2, 2, 6, 6, 3, 5)]
LINEAR_IMPLS = ["eager", "torch"]
TOL = dict(rtol=1e-5, atol=1e-5)


def qkv(shape, seed=0, dtype=torch.float32):
    B, H, Nq, Nk, D, Dv = shape
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, H, Nq, D, generator=g, dtype=dtype),
        torch.randn(B, H, Nk, D, generator=g, dtype=dtype),
        torch.randn(B, H, Nk, Dv, generator=g, dtype=dtype),
    )


def close(actual, expected, **tol):
    torch.testing.assert_close(actual.double(), expected.double(), **(tol or TOL))


# -- softmax -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_softmax_matches_formula(shape, fused, scale):
    q, k, v = qkv(shape)
    out = AF.softmax_attention(q, k, v, scale=scale, fused=fused)
    assert out.shape == shape[:3] + (shape[5],) and out.dtype == v.dtype
    close(out, softmax_ref(q, k, v, scale)[0])


def test_softmax_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = qkv((2, 2, 6, 6, 9, 4))
    close(AF.softmax_attention(q, k, v), AF.softmax_attention(q, k, v, scale=1 / 3))
    assert not torch.allclose(AF.softmax_attention(q, k, v), AF.softmax_attention(q, k, v, scale=1.0))


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_return_attn_gives_the_row_stochastic_matrix(shape):
    q, k, v = qkv(shape, seed=1)
    out, attn = AF.softmax_attention(q, k, v, return_attn=True)
    ref_out, ref_attn = softmax_ref(q, k, v)
    close(attn, ref_attn)
    close(out, ref_out)
    assert (attn >= 0).all()
    close(attn.sum(-1), torch.ones(shape[:3]))
    close(AF.softmax_probs(q, k), ref_attn)


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_sdpa_path_equals_eager_path(shape):
    q, k, v = qkv(shape, seed=2)
    close(AF.softmax_attention(q, k, v, fused=True), AF.softmax_attention(q, k, v, fused=False))


def _keep_mask(shape, broadcast: bool, seed=3):
    B, H, Nq, Nk = shape[:4]
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand((Nq, Nk) if broadcast else (B, 1, Nq, Nk), generator=g) > 0.5
    mask[..., 0] = True  # every query keeps at least one key
    return mask


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("broadcast", [True, False])
def test_softmax_bool_keep_mask(fused, broadcast):
    shape = (2, 3, 5, 7, 4, 6)
    q, k, v = qkv(shape)
    mask = _keep_mask(shape, broadcast)
    out = AF.softmax_attention(q, k, v, attn_mask=mask, fused=fused)
    close(out, softmax_ref(q, k, v, mask=mask)[0])
    _, attn = AF.softmax_attention(q, k, v, attn_mask=mask, return_attn=True)
    assert (attn.expand(2, 3, 5, 7)[~mask.expand(2, 3, 5, 7)] == 0).all()  # masked keys get exactly 0


@pytest.mark.parametrize("fused", [True, False])
def test_softmax_additive_float_mask(fused):
    shape = (2, 3, 5, 7, 4, 6)
    q, k, v = qkv(shape)
    mask = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(4)) * 2
    close(AF.softmax_attention(q, k, v, attn_mask=mask, fused=fused), softmax_ref(q, k, v, mask=mask)[0])


def test_additive_mask_converts_keep_mask():
    keep = torch.tensor([[True, False], [False, True]])
    add = AF.additive_mask(keep, torch.zeros(()))
    assert add.dtype == torch.float32
    assert add[0, 0] == 0 and add[1, 1] == 0 and add[0, 1] == -math.inf and add[1, 0] == -math.inf
    float_mask = torch.randn(2, 2)
    assert AF.additive_mask(float_mask, float_mask) is float_mask


# -- entropy-invariant scale ---------------------------------------------------------------------
@pytest.mark.parametrize("d, n, n_train", [(16, 65, 65), (16, 257, 65), (64, 197, 50), (8, 10, 1000)])
def test_entropy_scale_formula(d, n, n_train):
    kappa = math.sqrt(d) / math.log(n_train)
    assert AF.entropy_scale(d, n, n_train) == pytest.approx(kappa * math.log(n) / d, rel=1e-12)


@pytest.mark.parametrize("d", [1, 16, 64])
def test_entropy_scale_equals_inverse_sqrt_d_at_training_length(d):
    assert AF.entropy_scale(d, 65, 65) == pytest.approx(d**-0.5, rel=1e-12)
    assert AF.entropy_scale(d, 257, 65) > d**-0.5 > AF.entropy_scale(d, 17, 65)


def test_entropy_scale_rejects_degenerate_training_length():
    with pytest.raises(ValueError, match="train_keys"):
        AF.entropy_scale(16, 10, 1)


# -- linear (kernel) attention -------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("feature_map", ["elu", "relu", "taylor"])
@pytest.mark.parametrize("impl", LINEAR_IMPLS)
def test_linear_matches_formula(shape, feature_map, impl):
    q, k, v = qkv(shape, seed=5)
    out = AF.linear_attention(q, k, v, feature_map=feature_map, impl=impl)
    assert out.shape == shape[:3] + (shape[5],) and out.dtype == v.dtype
    close(out, kernel_ref(q, k, v, feature_map)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_relu_denominator_eps(eps):
    """relu features can vanish: a query with no positive channel gives 0 (not NaN), eps is used."""
    q, k, v = qkv((2, 2, 6, 6, 4, 3), seed=6)
    q[:, :, 0] = -q[:, :, 0].abs()  # phi(q_0) = 0
    out = AF.linear_attention(q, k, v, feature_map="relu", eps=eps, impl="eager")
    assert torch.isfinite(out).all() and (out[:, :, 0] == 0).all()
    close(out, kernel_ref(q, k, v, "relu", eps=eps)[0])


@pytest.mark.parametrize("shape", SELF_SHAPES)
@pytest.mark.parametrize("feature_map", ["elu", "relu", "taylor"])
def test_causal_linear_matches_masked_reference(shape, feature_map):
    q, k, v = qkv(shape, seed=7)
    out = AF.linear_attention(q, k, v, feature_map=feature_map, causal=True, impl="auto")
    close(out, kernel_ref(q, k, v, feature_map, causal=True)[0], rtol=1e-4, atol=1e-5)
    close(AF.kernel_probs(q, k, feature_map, causal=True), kernel_ref(q, k, v, feature_map, causal=True)[1])


def test_causal_linear_ignores_future_tokens():
    q, k, v = qkv((1, 2, 8, 8, 4, 4), seed=8)
    out = AF.linear_attention(q, k, v, causal=True, impl="eager")
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 5:] += 3.0
    v2[:, :, 5:] -= 2.0
    out2 = AF.linear_attention(q, k2, v2, causal=True, impl="eager")
    torch.testing.assert_close(out[:, :, :5], out2[:, :, :5])
    assert not torch.allclose(out[:, :, 5:], out2[:, :, 5:])


@pytest.mark.parametrize("shape", SHAPES)
def test_taylor_implied_matrix_is_one_plus_cosine(shape):
    q, k, v = qkv(shape, seed=9)
    qn, kn = q.double() / q.double().norm(dim=-1, keepdim=True), k.double() / k.double().norm(dim=-1, keepdim=True)
    sim = 1 + qn @ kn.transpose(-2, -1)
    probs = AF.kernel_probs(q, k, "taylor", eps=0.0)
    close(probs, sim / sim.sum(-1, keepdim=True))
    close(AF.taylor_attention(q, k, v, impl="eager"), kernel_ref(q, k, v, "taylor")[0])


# -- efficient attention -------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_efficient_matches_formula(shape):
    q, k, v = qkv(shape, seed=10)
    out = AF.efficient_attention(q, k, v)
    assert out.shape == shape[:3] + (shape[5],) and out.dtype == v.dtype
    ref_out, ref_a = efficient_ref(q, k, v)
    close(out, ref_out)
    close(AF.efficient_probs(q, k), ref_a)


def test_efficient_is_not_the_exp_key_shortcut():
    """softmax_D(q) softmax_N(k)^T v differs from phi(q)=softmax_D(q), phi(k)=exp(k), normalised.

    They agree only when every key channel has the same sum of exp over tokens; give the two
    channels very different sums and the code must follow the formula (docs/mechanisms.md section 3).
    """
    g = torch.Generator().manual_seed(11)
    q = torch.randn(1, 1, 4, 2, generator=g) * 0.1
    v = torch.randn(1, 1, 4, 3, generator=g)
    k = torch.zeros(1, 1, 4, 2)
    k[..., 0, 0] = k[..., 1, 1] = 4.0  # channel 0 picks token 0, channel 1 picks token 1
    k[..., 0] += 5.0  # a constant per channel: no effect on softmax_N, dominates exp(k)
    qs = q.double().softmax(-1)
    shortcut = (qs @ (k.double().exp().transpose(-2, -1) @ v.double())) / (qs @ k.double().exp().sum(-2).unsqueeze(-1))
    formula = efficient_ref(q, k, v)[0]
    assert (formula - shortcut).abs().max() > 0.1  # the case separates the two
    out = AF.efficient_attention(q, k, v)
    close(out, formula)
    assert (out.double() - shortcut).abs().max() > 0.1


# -- implied matrices ------------------------------------------------------------------------------
def _implied(name, q, k):
    if name == "softmax":
        return AF.softmax_probs(q, k)
    if name == "efficient":
        return AF.efficient_probs(q, k)
    return AF.kernel_probs(q, k, name, eps=1e-6)


def _output(name, q, k, v):
    if name == "softmax":
        return AF.softmax_attention(q, k, v)
    if name == "efficient":
        return AF.efficient_attention(q, k, v)
    return AF.linear_attention(q, k, v, feature_map=name, impl="eager")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["softmax", "efficient", "elu", "taylor", "relu"])
def test_implied_matrix_rows_non_negative_sum_to_one_and_produce_the_output(shape, name):
    q, k, v = qkv(shape, seed=12)
    a = _implied(name, q, k)
    assert a.shape == shape[:4]
    assert (a >= 0).all()
    rows = a.sum(-1)
    if name == "relu":  # phi(q_i).z can be 0 (then the row is 0); otherwise sum/(sum+eps)
        assert (rows <= 1 + 1e-6).all() and ((rows - 1).abs() < 1e-4).logical_or(rows == 0).all()
    else:
        close(rows, torch.ones(shape[:3]), rtol=0, atol=1e-4)
    close(_output(name, q, k, v), a.double() @ v.double())


# -- gradcheck (float64, tiny shapes) ------------------------------------------------------------
GRAD_CASES = {
    "softmax_fused": lambda q, k, v: AF.softmax_attention(q, k, v, fused=True),
    "softmax_eager": lambda q, k, v: AF.softmax_attention(q, k, v, fused=False),
    "linear_elu_eager": lambda q, k, v: AF.linear_attention(q, k, v, "elu", impl="eager"),
    "linear_relu_eager": lambda q, k, v: AF.linear_attention(q, k, v, "relu", impl="eager"),
    "linear_causal": lambda q, k, v: AF.linear_attention(q, k, v, "elu", impl="eager", causal=True),
    "efficient": lambda q, k, v: AF.efficient_attention(q, k, v),
    "taylor_eager": lambda q, k, v: AF.taylor_attention(q, k, v, impl="eager"),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradcheck(name):
    q, k, v = (t.requires_grad_() for t in qkv((1, 2, 4, 4, 3, 2), seed=13, dtype=torch.float64))
    assert torch.autograd.gradcheck(GRAD_CASES[name], (q, k, v))


@pytest.mark.parametrize("name", ["softmax_eager", "efficient", "elu", "taylor", "relu"])
def test_float64_inputs_are_computed_in_float64(name):
    """fp32 accumulation is a floor, not a ceiling: float64 inputs keep float64 precision."""
    q, k, v = qkv((2, 2, 7, 7, 5, 3), seed=14, dtype=torch.float64)
    if name == "softmax_eager":
        out, ref = AF.softmax_attention(q, k, v, fused=False), softmax_ref(q, k, v)[0]
    else:
        out = _output(name, q, k, v)
        ref = (efficient_ref(q, k, v) if name == "efficient" else kernel_ref(q, k, v, name))[0]
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


# -- logit noise -------------------------------------------------------------------------------------
NOISY = {
    "softmax_fused": lambda q, k, v, s: AF.softmax_attention(q, k, v, logit_noise=s, fused=True),
    "softmax_eager": lambda q, k, v, s: AF.softmax_attention(q, k, v, logit_noise=s, fused=False),
    "linear_elu": lambda q, k, v, s: AF.linear_attention(q, k, v, "elu", impl="eager", logit_noise=s),
    "linear_relu": lambda q, k, v, s: AF.linear_attention(q, k, v, "relu", impl="eager", logit_noise=s),
    "linear_causal": lambda q, k, v, s: AF.linear_attention(q, k, v, "elu", causal=True, logit_noise=s),
    "taylor": lambda q, k, v, s: AF.taylor_attention(q, k, v, impl="eager", logit_noise=s),
    "efficient": lambda q, k, v, s: AF.efficient_attention(q, k, v, logit_noise=s),
}


@pytest.mark.parametrize("name", sorted(NOISY))
def test_zero_logit_noise_is_bit_identical_and_draws_nothing(name):
    q, k, v = qkv((2, 2, 6, 6, 4, 3), seed=15)
    clean = NOISY[name](q, k, v, 0.0)
    torch.manual_seed(123)
    out = NOISY[name](q, k, v, 0.0)
    after = torch.randn(4)
    torch.manual_seed(123)
    assert torch.equal(after, torch.randn(4)), "logit_noise=0 consumed the global RNG"
    assert torch.equal(out, clean)
    torch.manual_seed(123)
    assert not torch.allclose(NOISY[name](q, k, v, 0.5), clean)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_logit_noise_is_gaussian_on_the_logits(fused, masked):
    shape = (2, 3, 5, 7, 4, 6)
    q, k, v = qkv(shape, seed=16)
    mask = _keep_mask(shape, broadcast=True) if masked else None
    sigma = 0.7
    torch.manual_seed(7)
    out = AF.softmax_attention(q, k, v, logit_noise=sigma, attn_mask=mask, fused=fused)
    torch.manual_seed(7)
    noise = torch.randn(2, 3, 5, 7) * sigma
    close(out, softmax_ref(q, k, v, mask=mask, noise=noise)[0])


@pytest.mark.parametrize("feature_map", ["elu", "relu", "taylor"])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_logit_noise_is_a_per_key_factor_on_the_key_features(feature_map, causal):
    shape = (2, 3, 6, 6, 4, 5)
    q, k, v = qkv(shape, seed=17)
    sigma = 0.8
    torch.manual_seed(8)
    out = AF.linear_attention(q, k, v, feature_map, causal=causal, logit_noise=sigma)
    torch.manual_seed(8)
    eps = torch.randn(2, 3, 6, 1) * sigma
    close(out, kernel_ref(q, k, v, feature_map, causal=causal, key_noise=eps)[0], rtol=1e-4, atol=1e-5)


def test_efficient_logit_noise_is_a_per_key_factor_before_the_token_softmax():
    shape = (2, 3, 5, 7, 4, 6)
    q, k, v = qkv(shape, seed=18)
    sigma = 0.9
    torch.manual_seed(9)
    out = AF.efficient_attention(q, k, v, logit_noise=sigma)
    torch.manual_seed(9)
    eps = torch.randn(2, 3, 7, 1) * sigma
    close(out, efficient_ref(q, k, v, key_noise=eps)[0])


# -- bad input ---------------------------------------------------------------------------------------
def test_bad_functional_options_are_value_errors_naming_the_choices():
    q, k, v = qkv((1, 1, 3, 3, 2, 2))
    with pytest.raises(ValueError, match="elu"):
        AF.linear_attention(q, k, v, feature_map="gelu")
    with pytest.raises(ValueError, match="eager"):
        AF.linear_attention(q, k, v, impl="cuda")
    with pytest.raises(ValueError, match="auto"):
        AF.linear_attention(q, k, v, impl="torch", causal=True)
    with pytest.raises(ValueError, match="auto"):
        AF.linear_attention(q, k, v, impl="torch", logit_noise=0.1)
