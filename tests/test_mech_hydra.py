"""hydra: channel-wise cosine attention against an explicit float64 n x n matrix per channel."""

import pytest
import torch

from vitzoo.diagnostics import capture_attention

from attention_reference import module_out, module_qkv, single_thread  # noqa: F401
from mech_checks import assert_one_line_error, build, check_double_resolution, gradcheck_module


def channels(t):
    """(B, H, N, D) -> (B, N, H*D): the token's full vector."""
    return t.double().permute(0, 2, 1, 3).flatten(2)


def channel_matrices(q, k, key_noise=None):
    """A[b, c, i, t] = phi(q_i)_c phi(k_t)_c, phi(x) = x / |x| over all H*D channels; noise: exp(eps_t) on key t."""
    fq, fk = (x / x.norm(dim=-1, keepdim=True) for x in (channels(q), channels(k)))
    a = torch.einsum("bic,btc->bcit", fq, fk)
    if key_noise is not None:  # (B, H, N, 1): head h's keys carry eps_t on each of its channels
        a = a * key_noise.double().exp().repeat_interleave(q.shape[-1], dim=1).transpose(-2, -1)
    return a


def hydra_ref(q, k, v, key_noise=None):
    """out_ic = sum_t A[c, i, t] v_tc: an n x n matrix per channel, no normalisation."""
    a = channel_matrices(q, k, key_noise)
    out = torch.einsum("bcit,btc->bic", a, channels(v))
    return out.unflatten(-1, (q.shape[1], q.shape[-1])).transpose(1, 2)


def probs_ref(q, k):
    """Row-normalised sum over a head's channels of |A[c, i, t]|."""
    a = channel_matrices(q, k).abs().unflatten(1, (q.shape[1], q.shape[-1])).sum(2)
    return a / a.sum(-1, keepdim=True)


@pytest.mark.parametrize("heads", [{"heads": "split"}, {"heads": "projected", "head_dim": 5}])
def test_module_is_the_float64_formula(heads):
    attn = build({"name": "hydra", **heads}, qkv_bias=True).double()
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    torch.testing.assert_close(attn(x), module_out(attn, hydra_ref(q, k, v)), rtol=1e-10, atol=1e-12)
    with capture_attention(attn) as maps:
        attn(x)
    (probs,) = maps.values()
    torch.testing.assert_close(probs, probs_ref(q, k), rtol=1e-10, atol=1e-12)


def test_logit_noise_is_the_factor_exp_eps_on_each_key():
    attn = build({"name": "hydra", "logit_noise": 0.7}).double().train()
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = module_qkv(attn, x)
    torch.manual_seed(3)
    eps = torch.randn(2, 2, 16, 1, dtype=torch.float64) * 0.7
    torch.manual_seed(3)
    torch.testing.assert_close(attn(x), module_out(attn, hydra_ref(q, k, v, eps)), rtol=1e-10, atol=1e-12)


def test_no_denominator_the_output_grows_with_repeated_tokens():
    """Each token repeated twice: the same phi, twice the terms of the sum, twice the output."""
    attn = build("hydra")
    x = torch.randn(1, 8, 16)
    once, twice = attn(x), attn(x.repeat_interleave(2, dim=1))[:, ::2]
    bias = attn.proj.bias
    torch.testing.assert_close(twice - bias, 2 * (once - bias), rtol=1e-5, atol=1e-6)


def test_rescale_divides_the_shared_sum_by_the_token_ratio():
    """rescale: out = phi(q) * (n_train / n) * sum_t phi(k_t) * v_t; the factor is 1 at the training size, and
    repeating every token twice (the count doubled) no longer changes the output."""
    plain, scaled = build("hydra", tokens=16).double(), build({"name": "hydra", "rescale": True}, tokens=16).double()
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(scaled(x), plain(x), rtol=0, atol=0)  # training size: the very same numbers
    wide = torch.randn(2, 36, 16, dtype=torch.float64)
    q, k, v = module_qkv(scaled, wide)
    torch.testing.assert_close(scaled(wide), module_out(scaled, hydra_ref(q, k, v) * 16 / 36), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(scaled(x.repeat_interleave(2, dim=1))[:, ::2], scaled(x), rtol=1e-10, atol=1e-12)
    assert build({"name": "hydra", "rescale": True, "train_tokens": 32}, tokens=16).train_tokens == 32


def test_gradcheck():
    attn = build({"name": "hydra", "heads": "projected", "head_dim": 3}, dim=8, tokens=4).double()
    assert gradcheck_module(attn, torch.randn(1, 4, 8, dtype=torch.float64))


@pytest.mark.parametrize(
    "spec, kwargs, fix",
    [
        ({"name": "hydra", "scale": "log_n"}, {}, "no option"),
        ({"name": "hydra", "feature_map": "elu"}, {}, "no option"),
        ("hydra", dict(attn_drop=0.1), "attn_drop_rate=0"),
        ({"name": "hydra", "rescale": "yes"}, {}, "give true or false"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, kwargs, fix):
    assert_one_line_error(spec, fix, 16, 2, **kwargs)


def test_at_twice_the_resolution_in_both_backbones():
    check_double_resolution("hydra", lambda layer, q, k, v: hydra_ref(q, k, v))
