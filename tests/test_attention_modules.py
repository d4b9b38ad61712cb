"""Attention modules (the timm ``attn_layer`` contract) against float64 references, and the registry."""

import math

import pytest
import torch
import torch.nn as nn

import vitzoo
from vitzoo.attention import ZooAttention, attention_options, build_attention, resolve_attention

from attention_reference import (
    efficient_ref,
    kernel_ref,
    module_out,
    module_qkv,  # noqa: F401
    single_thread,  # noqa: F401 (an autouse fixture)
    softmax_ref,
)

LINEAR_IMPLS = ["eager", "torch"]
TOKEN_TO_TOKEN = ["softmax", "linear", "taylor", "efficient"]  # no position enters the mixing
TOL = dict(rtol=1e-5, atol=1e-5)


def standalone(name, **options):
    """A spec for ``name`` with ``options``."""
    return {"name": name, **options}


def build(spec, dim=16, num_heads=2, seed=0, tokens=16, **kwargs):
    torch.manual_seed(seed)
    side = math.isqrt(tokens)
    return build_attention(
        spec, dim, num_heads=num_heads, num_tokens=tokens, num_prefix_tokens=0, grid_size=(side, side), **kwargs
    )


def tokens(B=2, N=16, C=16, seed=1):
    return torch.randn(B, N, C, generator=torch.Generator().manual_seed(seed))


def _ref_mix(kind):
    return {
        "softmax": lambda q, k, v: softmax_ref(q, k, v)[0],
        "elu": lambda q, k, v: kernel_ref(q, k, v, "elu")[0],
        "relu": lambda q, k, v: kernel_ref(q, k, v, "relu")[0],
        "taylor": lambda q, k, v: kernel_ref(q, k, v, "taylor")[0],
        "efficient": lambda q, k, v: efficient_ref(q, k, v)[0],
    }[kind]


MODULE_CASES = [
    ("softmax", {"name": "softmax"}),
    ("softmax", {"name": "softmax", "fused": False}),
    ("efficient", {"name": "efficient"}),
] + [
    (kind, {"name": name, "impl": impl, **extra})
    for impl in LINEAR_IMPLS
    for kind, name, extra in [
        ("elu", "linear", {}),
        ("relu", "linear", {"feature_map": "relu"}),
        ("taylor", "taylor", {}),
    ]
]
HEADS = [{"heads": "split"}, {"heads": "projected"}, {"heads": "projected", "head_dim": 5}]


@pytest.mark.parametrize("kind, spec", MODULE_CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(MODULE_CASES)])
@pytest.mark.parametrize("heads", HEADS, ids=["split", "projected", "projected_d5"])
def test_module_matches_reference(kind, spec, heads):
    attn = build({**spec, **heads}, dim=12, num_heads=3, qkv_bias=True)
    x = tokens(N=9, C=12)
    q, k, v = module_qkv(attn, x)
    assert q.shape == (2, 3, 9, heads.get("head_dim", 4))
    expected = module_out(attn, _ref_mix(kind)(q, k, v))
    torch.testing.assert_close(attn(x).double(), expected, **TOL)


def test_sdpa_module_equals_eager_module():
    x = tokens()
    fused, eager = build({"name": "softmax", "fused": True}), build({"name": "softmax", "fused": False})
    torch.testing.assert_close(fused(x), eager(x), **TOL)


@pytest.mark.parametrize("name", TOKEN_TO_TOKEN)
@pytest.mark.parametrize("heads", ["split", "projected"])
def test_token_to_token_mechanisms_are_permutation_equivariant(name, heads):
    attn = build(standalone(name, heads=heads))
    x = tokens()
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(attn(x[:, perm]), attn(x)[:, perm], **TOL)


def test_permutation_test_can_fail():
    """The equivariance check catches a mechanism that looks at positions."""
    attn = build("softmax")
    x = tokens()
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(16, 16)  # a position-dependent additive mask
    assert not torch.allclose(attn(x[:, perm], attn_mask=bias), attn(x, attn_mask=bias)[:, perm], **TOL)


# -- masks and causality ---------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [True, False])
def test_softmax_module_masks_and_causal(fused):
    attn = build({"name": "softmax", "fused": fused})
    x = tokens()
    q, k, v = module_qkv(attn, x)
    keep = torch.rand(16, 16, generator=torch.Generator().manual_seed(3)) > 0.4
    keep.fill_diagonal_(True)
    torch.testing.assert_close(
        attn(x, attn_mask=keep).double(), module_out(attn, softmax_ref(q, k, v, mask=keep)[0]), **TOL
    )
    tril = torch.ones(16, 16, dtype=torch.bool).tril()
    torch.testing.assert_close(
        attn(x, is_causal=True).double(), module_out(attn, softmax_ref(q, k, v, mask=tril)[0]), **TOL
    )


@pytest.mark.parametrize("name", ["linear", "taylor"])
def test_linear_module_causal_flag_and_option_agree_with_reference(name):
    x = tokens()
    by_flag, by_option = build(standalone(name)), build(standalone(name, causal=True))
    q, k, v = module_qkv(by_flag, x)
    fmap = "taylor" if name == "taylor" else "elu"
    expected = module_out(by_flag, kernel_ref(q, k, v, fmap, causal=True)[0])
    torch.testing.assert_close(by_flag(x, is_causal=True).double(), expected, **TOL)
    torch.testing.assert_close(by_option(x).double(), expected, **TOL)


# What each mechanism has no form for (attn_mask, is_causal); a new mechanism must say here.
REFUSES = {
    "softmax": (),
    "linear": (),
    "taylor": (),
    "performer": (),
    "efficient": ("is_causal",),
    "hydra": ("is_causal",),
    "focused_linear": ("is_causal",),
    "agent": ("is_causal",),
    "linformer": ("attn_mask", "is_causal"),
    "nystrom": ("is_causal",),
    "window": ("is_causal",),
    "pola": ("is_causal",),
    "inline": ("is_causal",),
    "mlla": ("is_causal",),
    "rala": ("is_causal",),
    "ravlt_softmax": ("is_causal",),
    "lion": ("attn_mask", "is_causal"),
    "synth_random": (),
    "synth_factorized_random": (),
    "synth_dense": (),
    "synth_factorized_dense": (),
    "synth_mix": (),
}


@pytest.mark.parametrize("name", vitzoo.list_attentions())
def test_a_mask_or_causal_call_runs_or_is_one_line_naming_the_fix(name):
    """Every mechanism takes attn_mask and is_causal, or refuses each in one line saying why and what to use;
    none ignores one silently."""
    assert name in REFUSES, f"say in REFUSES what {name} has no form for"
    layer = (
        vitzoo.create_model(
            "vit_cifar", attention=name, img_size=16, patch_size=4, depth=1, embed_dim=16, num_heads=2, num_classes=3
        )
        .blocks[0]
        .attn
    )
    x = torch.randn(1, 17, 16)
    for option, call in (
        ("attn_mask", dict(attn_mask=torch.ones(17, 17, dtype=torch.bool))),
        ("is_causal", dict(is_causal=True)),
    ):
        if option in REFUSES[name]:
            with pytest.raises(ValueError, match=f"takes no {option}: .*use attention=") as err:
                layer(x, **call)
            assert len(str(err.value).splitlines()) == 1
        else:
            assert torch.isfinite(layer(x, **call)).all()


# -- the log-n scale -----------------------------------------------------------------------------------
def test_log_n_scale_equals_sqrt_d_at_training_tokens_and_follows_formula_elsewhere():
    d, n_train = 8, 16
    log_n = build({"name": "softmax", "scale": "log_n", "train_tokens": n_train})
    sqrt_d = build({"name": "softmax"})
    x = tokens(N=n_train)
    torch.testing.assert_close(log_n(x), sqrt_d(x), **TOL)
    for n in (4, 49):
        x = tokens(N=n, seed=n)
        q, k, v = module_qkv(log_n, x)
        scale = math.sqrt(d) / math.log(n_train) * math.log(n) / d
        torch.testing.assert_close(log_n(x).double(), module_out(log_n, softmax_ref(q, k, v, scale=scale)[0]), **TOL)
        assert not torch.allclose(log_n(x), sqrt_d(x), **TOL)


@pytest.mark.parametrize("fused", [True, False])
def test_log_n_scale_counts_the_keys_each_query_attends(fused):
    """docs/mechanisms.md section 1: n is the number of keys a query actually attends (a mask, causal rows)."""
    d, n_train, n = 8, 16, 49
    attn = build({"name": "softmax", "scale": "log_n", "train_tokens": n_train, "fused": fused})
    x = tokens(N=n, seed=3)
    q, k, v = module_qkv(attn, x)
    padded = torch.zeros(n, n, dtype=torch.bool)
    padded[:, :n_train] = True  # every query sees the training count: the sqrt_d scale, whatever the padding
    expected = softmax_ref(q, k, v, scale=d**-0.5, mask=padded)[0]
    torch.testing.assert_close(attn(x, attn_mask=padded).double(), module_out(attn, expected), **TOL)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    per_row = (
        torch.arange(1, n + 1, dtype=torch.float64).clamp_min(2).log().unsqueeze(-1) * d**0.5 / math.log(n_train) / d
    )
    expected = softmax_ref(q, k, v, scale=per_row, mask=causal)[0]
    torch.testing.assert_close(attn(x, is_causal=True).double(), module_out(attn, expected), **TOL)


def test_synth_mix_log_n_part_counts_the_keys_each_query_attends():
    """The same rule for the q k^T part of a Synthesizer mixture (alone here: alpha = 1)."""
    d, n = 8, 16
    attn = build({"name": "synth_mix", "parts": ["softmax"], "scale": "log_n"}, tokens=n)
    x = tokens(N=n, seed=3)
    q, k, v = module_qkv(attn, x)
    half = torch.zeros(n, n, dtype=torch.bool)
    half[:, : n // 2] = True
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for mask, is_causal, keep in [(half, False, half), (None, True, causal), (half, True, half & causal)]:
        scale = keep.sum(-1, keepdim=True).double().clamp_min(2).log() * d**0.5 / math.log(n) / d
        expected = softmax_ref(q, k, v, scale=scale, mask=keep)[0]
        torch.testing.assert_close(
            attn(x, attn_mask=mask, is_causal=is_causal).double(), module_out(attn, expected), **TOL
        )


def test_log_n_scale_uses_the_model_token_count_by_default():
    attn = build({"name": "softmax", "scale": "log_n"}, tokens=25)
    same = build({"name": "softmax"}, tokens=25)
    x = tokens(N=25)
    torch.testing.assert_close(attn(x), same(x), **TOL)


# -- heads: split vs projected -------------------------------------------------------------------------
def _in_proj_params(attn):
    return sum(p.numel() for p in attn.in_proj.parameters())


@pytest.mark.parametrize("name", ["softmax", "linear", "efficient"])
def test_split_and_projected_shapes_and_parameter_counts(name):
    C, H = 24, 3
    split = build(standalone(name), dim=C, num_heads=H)
    proj = build(standalone(name, heads="projected"), dim=C, num_heads=H)
    proj5 = build(standalone(name, heads="projected", head_dim=5), dim=C, num_heads=H)
    x = tokens(N=16, C=C)
    for attn, D in ((split, 8), (proj, 8), (proj5, 5)):
        q, k, v = attn.project(x)
        assert q.shape == k.shape == v.shape == (2, H, 16, D)
        assert attn(x).shape == (2, 16, C)
    assert _in_proj_params(split) == C * 3 * C
    assert _in_proj_params(proj) == C * 3 * C + 3 * C * H * 8
    assert _in_proj_params(proj5) == C * 3 * C + 3 * C * H * 5
    assert sum(p.numel() for p in proj5.proj.parameters()) == H * 5 * C + C


def test_projected_heads_allow_dims_not_divisible_by_heads():
    attn = build({"name": "softmax", "heads": "projected", "head_dim": 7}, dim=10, num_heads=3)
    x = tokens(C=10)
    assert attn.project(x)[0].shape == (2, 3, 16, 7)
    assert attn(x).shape == (2, 16, 10)


def test_split_and_projected_start_at_the_same_qkv_scale():
    x = tokens(B=4, N=64, C=64)
    split, proj = (
        build("softmax", dim=64, num_heads=4),
        build({"name": "softmax", "heads": "projected"}, dim=64, num_heads=4),
    )
    with torch.no_grad():
        pairs = list(zip(split.project(x), proj.project(x)))
    for a, b in pairs:
        assert 0.8 < float(a.std() / b.std()) < 1.25


@pytest.mark.parametrize("heads", ["split", "projected"])
def test_qk_norm_normalises_each_head(heads):
    attn = build({"name": "softmax", "heads": heads}, qk_norm=True, norm_layer=nn.LayerNorm)
    q, k, v = attn.project(tokens())
    for t in (q, k):
        torch.testing.assert_close(t.mean(-1), torch.zeros(t.shape[:-1]), atol=1e-5, rtol=0)
    assert v.mean(-1).abs().max() > 1e-3  # values are not normalised


# -- logit noise on every mechanism ---------------------------------------------------------------------
NAMES = vitzoo.list_attentions()


@pytest.mark.parametrize("name", NAMES)
def test_module_logit_noise(name):
    x = tokens()
    plain = build(standalone(name))
    zero, noisy = build(standalone(name, logit_noise=0.0)), build(standalone(name, logit_noise=1.0))
    for m in (plain, zero, noisy):
        m.train()
    clean = plain(x)
    torch.manual_seed(5)
    out0 = zero(x)
    after = torch.randn(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.randn(3)), "logit_noise=0 consumed the global RNG"
    assert torch.equal(out0, clean), "logit_noise=0 is not bit-identical to no noise"
    assert not torch.allclose(noisy(x), clean, **TOL), "logit_noise>0 in train mode left the output unchanged"
    noisy.eval()
    plain.eval()
    assert torch.equal(noisy(x), plain(x)), "logit noise leaked into eval mode"
    noisy.eval_logit_noise = 1.0
    assert not torch.allclose(noisy(x), plain(x), **TOL), "eval_logit_noise did not switch noise on in eval"
    noisy.eval_logit_noise = 0.0
    assert torch.equal(noisy(x), plain(x))


# -- registry and bad input ------------------------------------------------------------------------------
def test_registry_lists_the_mechanisms():
    names = vitzoo.list_attentions()
    assert names == sorted(names)
    assert {"softmax", "linear", "taylor", "efficient"} <= set(names)
    for name in names:
        cls, _ = resolve_attention(name)
        assert issubclass(cls, ZooAttention)
        assert {"heads", "head_dim", "logit_noise"} <= set(attention_options(cls))


def test_taylor_is_linear_with_the_taylor_feature_map():
    x = tokens()
    taylor = build(standalone("taylor"))
    linear = build(standalone("linear", feature_map="taylor"))
    assert torch.equal(taylor(x), linear(x))


def test_unknown_mechanism_lists_valid_names():
    with pytest.raises(ValueError) as err:
        build_attention("softmaxx", 16)
    for name in vitzoo.list_attentions():
        assert name in str(err.value)
    with pytest.raises(ValueError, match="name"):
        build_attention({"feature_map": "elu"}, 16)


def test_unknown_option_lists_valid_options():
    with pytest.raises(ValueError, match="feature_map") as err:
        build_attention({"name": "softmax", "feature_map": "elu"}, 16)
    assert "scale" in str(err.value) and "logit_noise" in str(err.value)


@pytest.mark.parametrize(
    "spec, kwargs, fix",
    [
        ("softmax", dict(dim=10, num_heads=3), "head_dim"),
        ({"name": "softmax", "heads": "merged"}, {}, "projected"),
        ({"name": "softmax", "scale": "log"}, {}, "log_n"),
        ({"name": "linear", "feature_map": "gelu"}, {}, "elu"),
        ({"name": "linear", "impl": "cuda"}, {}, "eager"),
        ({"name": "efficient", "logit_noise": -1.0}, {}, ">= 0"),
        ({"name": "softmax", "heads": "projected"}, dict(dim=10, num_heads=3), "head_dim"),
        ({"name": "softmax", "head_dim": 0}, {}, "positive integer"),
        ("linear", dict(attn_drop=0.1), "attn_drop_rate=0"),
        ("efficient", dict(attn_drop=0.1), "nothing to drop"),
    ],
)
def test_bad_options_are_value_errors_naming_the_fix(spec, kwargs, fix):
    kwargs = {"dim": 16, "num_heads": 2, **kwargs}
    with pytest.raises(ValueError, match=fix) as err:
        build_attention(spec, kwargs.pop("dim"), **kwargs)
    assert "\n" not in str(err.value)  # one line


COUNT_OPTIONS = [  # (mechanism, count-like option, a good value)
    ("softmax", "head_dim", 8),
    ("linformer", "proj_len", 4),
    ("lion", "chunk", 8),
    ("nystrom", "num_landmarks", 4),
    ("nystrom", "pinv_iterations", 6),
    ("nystrom", "conv_kernel", 3),
    ("window", "window_size", 2),
    ("mlla", "kernel_size", 3),
]


@pytest.mark.parametrize("name, option, good", COUNT_OPTIONS)
@pytest.mark.parametrize("bad", [[3], "3", True, 2.5, -1])
def test_a_count_option_of_the_wrong_type_is_one_value_error(name, option, good, bad):
    """A list, a string, a bool or a fraction where a count goes is one ValueError naming the option, never a
    TypeError from deep inside torch."""
    with pytest.raises(ValueError, match=option) as err:
        build_attention({"name": name, option: bad}, 16, num_heads=2, grid_size=(4, 4), num_tokens=16)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, option, good", COUNT_OPTIONS)
def test_a_count_option_written_as_a_whole_float_builds_the_int_layer(name, option, good):
    """3.0 (YAML, a CLI override) builds the same layer as 3."""
    layers = [
        build_attention({"name": name, option: value}, 16, num_heads=2, grid_size=(4, 4), num_tokens=16)
        for value in (good, float(good))
    ]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(2, 16, 16)
    torch.testing.assert_close(layers[1].eval()(x), layers[0].eval()(x), rtol=0, atol=0)
    assert repr(layers[1]) == repr(layers[0])


def test_log_n_scale_needs_a_training_token_count_outside_a_model():
    with pytest.raises(ValueError, match="train_tokens"):
        build_attention({"name": "softmax", "scale": "log_n"}, 16, num_heads=2)
    with pytest.raises(ValueError, match="at least 2 tokens at training, got 1.*scale: sqrt_d"):
        build_attention({"name": "softmax", "scale": "log_n", "train_tokens": 1}, 16, num_heads=2)


@pytest.mark.parametrize("name", ["softmax", "linear", "efficient"])
def test_gradcheck_of_projected_head_modules(name):
    torch.manual_seed(0)
    m = build_attention(
        {"name": name, "heads": "projected", "head_dim": 3, **({"fused": False} if name == "softmax" else {})},
        8,
        num_heads=2,
    ).double()
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in m.named_parameters()]
    assert torch.autograd.gradcheck(
        lambda x, *p: torch.func.functional_call(m, dict(zip(names, p)), (x,)), (x, *m.parameters())
    )
