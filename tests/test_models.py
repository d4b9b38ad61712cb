"""Backbones: every architecture x mechanism trains a step at two resolutions; the non-local block,
features, timm registration and bad input."""

import copy

import pytest
import timm
import torch
import torch.nn as nn

import vitzoo
from vitzoo.attention import LinearAttention, SoftmaxAttention, ZooAttention, resolve_attention
from vitzoo.models import NonLocalBlock, NonLocalResNet, ZooVisionTransformer, default_feature_levels

from attention_reference import module_out, module_qkv, single_thread, softmax_ref  # noqa: F401

SMALL_VIT = dict(depth=1, embed_dim=48, num_classes=5)  # 48 splits into 3, 6 and 12 heads
SMALL_RESNET = dict(channels=(8, 16, 32, 64), stem_width=8, num_classes=5, img_size=32)


ISOTROPIC = [a for a in vitzoo.list_models() if a.startswith(("vit", "nonlocal"))]  # pyramids: test_pyramids.py


def small(arch):
    """Fast overrides keeping the architecture's shape (heads, block type, stage layout)."""
    if arch.startswith("vit"):
        return {**SMALL_VIT, "img_size": 32, "patch_size": 4 if arch == "vit_cifar" else 8}
    return dict(SMALL_RESNET)


def resolutions(arch):
    return (32, 48) if arch.startswith("vit") else (32, 64)


def spec(name, **options):
    """``name`` with options."""
    return {"name": name, **options}


def test_list_models_names():
    models = vitzoo.list_models()
    assert models == sorted(models)
    assert {"vit_tiny", "vit_small", "vit_base", "vit_cifar"} <= set(models)
    assert {"nonlocal_resnet18", "nonlocal_resnet50"} <= {m for m in models if "nonlocal" in m}


@pytest.mark.parametrize("name", vitzoo.list_attentions())
@pytest.mark.parametrize("arch", ISOTROPIC)
def test_every_architecture_and_mechanism_trains_at_two_resolutions(arch, name):
    torch.manual_seed(0)
    model = vitzoo.create_model(arch, attention=spec(name), **small(arch))
    layers = [m for m in model.modules() if isinstance(m, ZooAttention)]
    assert layers and all(type(m) is resolve_attention(name)[0] for m in layers)
    for size in resolutions(arch):
        model.zero_grad()
        out = model(torch.randn(2, 3, size, size))
        assert out.shape == (2, 5) and torch.isfinite(out).all()
        out.square().mean().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        if arch.startswith("vit"):  # the attention itself learns
            assert any(p.grad.abs().sum() > 0 for m in layers for p in m.parameters() if p.requires_grad)
        else:  # the non-local blocks start as identity: only their closing BN scale moves first
            assert all(b.norm.weight.grad.abs().sum() > 0 for b in model.modules() if isinstance(b, NonLocalBlock))


@pytest.mark.parametrize("arch", ISOTROPIC)
def test_timm_create_model_reaches_the_zoo(arch):
    model = timm.create_model(f"vitzoo_{arch}", attention=spec("efficient"), **small(arch))  # timm's name
    assert isinstance(model, ZooVisionTransformer if arch.startswith("vit") else NonLocalResNet)
    assert any(type(m).__name__ == "EfficientAttention" for m in model.modules())


def test_attention_options_reach_every_layer():
    model = vitzoo.create_model(
        "vit_small",
        attention=spec("linear", feature_map="relu", heads="projected", head_dim=5),
        **{**small("vit_small"), "depth": 2},
    )
    layers = [b.attn for b in model.blocks]
    assert len(layers) == 2 and all(isinstance(m, LinearAttention) for m in layers)
    assert all(
        m.phi.fused_map == "relu" and m.heads == "projected" and m.head_dim == 5 and m.num_heads == 6 for m in layers
    )
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    default = vitzoo.create_model("vit_tiny", **small("vit_tiny"))
    assert isinstance(default.blocks[0].attn, SoftmaxAttention)


def test_log_n_scale_in_a_vit_matches_sqrt_d_at_training_resolution_only():
    kwargs = small("vit_cifar")
    torch.manual_seed(0)
    log_n = vitzoo.create_model("vit_cifar", attention={"name": "softmax", "scale": "log_n"}, **kwargs).eval()
    torch.manual_seed(0)
    sqrt_d = vitzoo.create_model("vit_cifar", attention="softmax", **kwargs).eval()
    assert log_n.blocks[0].attn.train_tokens == 1 + 8 * 8  # class token + patches at 32 px
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(log_n(x), sqrt_d(x), rtol=1e-5, atol=1e-5)
    x = torch.randn(2, 3, 64, 64)
    assert not torch.allclose(log_n(x), sqrt_d(x), rtol=1e-5, atol=1e-5)


# -- non-local -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["softmax", "linear", "efficient"])
def test_nonlocal_block_starts_as_identity(name):
    torch.manual_seed(0)
    block = NonLocalBlock(16, spec(name), grid_size=(5, 6))
    x = torch.randn(2, 16, 5, 6)
    assert torch.equal(block(x), x)
    block.eval()
    assert torch.equal(block(x), x)
    nn.init.ones_(block.norm.weight)
    assert not torch.allclose(block(x), x)


def test_nonlocal_block_adds_attention_over_all_positions():
    """y = x + BN(W_z softmax(theta phi^T / sqrt d) g) with positions as tokens (row-major)."""
    torch.manual_seed(0)
    block = NonLocalBlock(8, "softmax", reduction=2, grid_size=(3, 4)).eval()
    nn.init.ones_(block.norm.weight)  # BN(y) = y / sqrt(1 + eps) in eval with fresh stats
    x = torch.randn(2, 8, 3, 4)
    tokens = x.flatten(2).transpose(1, 2)
    q, k, v = module_qkv(block.attn, tokens)
    assert q.shape == (2, 1, 12, 4)  # one head of C / reduction channels
    y = module_out(block.attn, softmax_ref(q, k, v)[0]) / (1 + block.norm.eps) ** 0.5
    expected = x.double() + y.transpose(1, 2).reshape(2, 8, 3, 4)
    torch.testing.assert_close(block(x).double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["nonlocal_resnet18", "nonlocal_resnet50", "nonlocal_resnet18_cifar"])
def test_nonlocal_resnet_at_init_equals_the_plain_resnet(arch):
    torch.manual_seed(0)
    model = vitzoo.create_model(arch, attention=spec("linear"), **small(arch)).eval()
    blocks = [n for n, m in model.named_modules() if isinstance(m, NonLocalBlock)]
    assert [n.split(".")[0] for n in blocks] == ["layer2", "layer3"]  # default stages (2, 3)
    plain = copy.deepcopy(model)
    for name in blocks:
        stage, index = name.split(".")
        getattr(plain, stage)[int(index)] = nn.Identity()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), plain(x), rtol=0, atol=0)


def test_nonlocal_placement_options():
    model = vitzoo.create_model(
        "nonlocal_resnet50", nonlocal_stages=(1, 3), nonlocal_per_stage=2, **small("nonlocal_resnet50")
    )
    for stage, blocks, width in ((1, 3, 32), (3, 6, 128)):
        layer = getattr(model, f"layer{stage}")
        nl = [i for i, m in enumerate(layer) if isinstance(m, NonLocalBlock)]
        assert len(nl) == 2 and len(layer) == blocks + 2 and nl[-1] == len(layer) - 1
        assert all(layer[i].norm.num_features == width for i in nl)
    assert not any(isinstance(m, NonLocalBlock) for m in list(model.layer2) + list(model.layer4))
    with pytest.raises(ValueError, match="1..4"):
        vitzoo.create_model("nonlocal_resnet18", nonlocal_stages=(5,), **small("nonlocal_resnet18"))
    with pytest.raises(ValueError, match="nonlocal_per_stage"):
        vitzoo.create_model("nonlocal_resnet18", nonlocal_per_stage=3, **small("nonlocal_resnet18"))


# -- features ---------------------------------------------------------------------------------------
def test_default_feature_levels():
    assert default_feature_levels(12) == (2, 5, 8, 11)
    assert default_feature_levels(24) == (5, 11, 17, 23)
    assert default_feature_levels(2) == (0, 1)


def test_vit_features_only_at_twice_the_training_resolution():
    model = vitzoo.create_model("vit_tiny", img_size=32, patch_size=8, embed_dim=24, features_only=True)
    assert tuple(model.feature_info.out_indices) == (2, 5, 8, 11)
    feats = model(torch.randn(2, 3, 64, 64))
    assert [tuple(f.shape) for f in feats] == [(2, 24, 8, 8)] * 4


def test_nonlocal_features_follow_the_cifar_stem_reductions():
    kwargs = {**small("nonlocal_resnet18_cifar"), "num_classes": 0}
    model = vitzoo.create_model("nonlocal_resnet18_cifar", features_only=True, **kwargs)
    feats = model(torch.randn(2, 3, 32, 32))
    assert model.feature_info.reduction() == [1, 1, 2, 4, 8]
    assert [f.shape[-1] for f in feats] == [32 // r for r in model.feature_info.reduction()]
    assert [f.shape[1] for f in feats] == model.feature_info.channels()


# -- fused kernels vs eager -------------------------------------------------------------------------------
@pytest.mark.parametrize("feature_map", ["elu", "relu", "taylor"])
def test_vit_linear_torch_impl_equals_eager(feature_map):
    kwargs = {**small("vit_cifar"), "depth": 2}
    models = {}
    for impl in ("torch", "eager"):
        torch.manual_seed(0)
        attention = {"name": "linear", "feature_map": feature_map, "impl": impl}
        models[impl] = vitzoo.create_model("vit_cifar", attention=attention, **kwargs)
    x = torch.randn(2, 3, 32, 32)
    outs = {impl: m(x) for impl, m in models.items()}
    torch.testing.assert_close(outs["torch"], outs["eager"], rtol=1e-4, atol=1e-5)
    for out in outs.values():
        out.square().mean().backward()
    for (name, a), b in zip(models["torch"].named_parameters(), models["eager"].parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


# -- bad input ------------------------------------------------------------------------------------------
def test_unknown_architecture_and_mechanism_list_the_valid_names():
    with pytest.raises(ValueError) as err:
        vitzoo.create_model("vit_huge")
    assert all(m in str(err.value) for m in vitzoo.list_models())
    with pytest.raises(ValueError) as err:
        vitzoo.create_model("vit_tiny", attention="softmaxx", **small("vit_tiny"))
    assert all(n in str(err.value) for n in vitzoo.list_attentions())


def test_model_level_bad_options_name_the_fix():
    with pytest.raises(ValueError, match="head_dim"):
        vitzoo.create_model("vit_tiny", **{**small("vit_tiny"), "embed_dim": 50})
    with pytest.raises(ValueError, match="valid options"):
        vitzoo.create_model("vit_tiny", attention={"name": "efficient", "feature_map": "elu"}, **small("vit_tiny"))
    with pytest.raises(ValueError, match="multiple of the patch size"):
        vitzoo.create_model("vit_tiny", **{**small("vit_tiny"), "img_size": 36})


@pytest.mark.parametrize("img_size", [100, 37])
@pytest.mark.parametrize(
    "attention",
    [{"name": "synth_random", "interpolate": False}, {"name": "softmax", "scale": "log_n"}],
    ids=["synth_fixed_grid", "log_n"],
)
def test_nonlocal_blocks_are_built_for_the_real_feature_map(img_size, attention):
    """Odd sizes: timm's stride-2 layers round up, so the grid a block is built for must too."""
    model = vitzoo.create_model(
        "nonlocal_resnet18",
        attention=attention,
        img_size=img_size,
        num_classes=3,
        channels=[8, 16, 32, 64],
        stem_width=8,
    ).eval()
    with torch.no_grad():
        model(torch.randn(1, 3, img_size, img_size))  # interpolate: false would refuse a wrong grid
    for block in (m for m in model.modules() if isinstance(m, NonLocalBlock)):
        n = block.attn.token_grid[0] * block.attn.token_grid[1]
        built = getattr(block.attn, "built_layout", None)
        assert built is None or (built.h, built.w) == block.attn.token_grid
        if attention["name"] == "softmax":
            assert block.attn.logit_scale(n) == pytest.approx(block.attn.head_dim**-0.5)


@pytest.mark.parametrize("name", vitzoo.list_attentions())
def test_every_mechanism_runs_a_non_square_input(name):
    model = vitzoo.create_model("vit_cifar", attention=name, depth=1, embed_dim=32, num_heads=2).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 48, 24))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
