"""MLLA-T / S (vitzoo.models.mlla): a state dict in the official layout (names transcribed from LeapLabTHU/MLLA
models/mlla.py) loads strictly and gives the official forward, written here from its formulas in float64; the
official parameter counts and FLOPs; any mechanism per stage; features, smp, export."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

import vitzoo
from vitzoo.attention import MllaAttention, SoftmaxAttention, RalaAttention
from staged_checks import (
    Shapes,
    batch_norm,
    bn_shapes,
    check_gmacs,
    conv,
    load_official_file,
    conv_shapes,
    grid_axes,
    linear_shapes,
    parameter_count,
    random_state,
    rotate_pairs,
)

TINY = dict(embed_dim=64, depths=(2, 4, 8, 4), num_heads=(2, 4, 8, 16))


def official_shapes(embed_dim, depths, num_heads, classes=1000, grid=56) -> Shapes:
    """The official MLLA's state dict: names and shapes (LeapLabTHU/MLLA models/mlla.py, PYRAMIDS.md section 5)."""
    D, half = embed_dim, embed_dim // 2
    s: Shapes = {}

    def conv_layer(prefix, cin, cout, k, groups=1, bias=True, bn=True):
        s.update(conv_shapes(f"{prefix}.conv", cin, cout, k, groups, bias))
        if bn:
            s.update(bn_shapes(f"{prefix}.norm", cout))

    conv_layer("patch_embed.conv1", 3, half, 3, bias=False)
    conv_layer("patch_embed.conv2.0", half, half, 3, bias=False)
    conv_layer("patch_embed.conv2.1", half, half, 3, bias=False)
    conv_layer("patch_embed.conv3.0", half, 4 * D, 3, bias=False)
    conv_layer("patch_embed.conv3.1", 4 * D, D, 1, bias=False)
    for i, depth in enumerate(depths):
        C, h = D * 2**i, grid // 2**i
        for j in range(depth):
            b = f"layers.{i}.blocks.{j}"
            for name in ("cpe1", "dwc", "cpe2", "attn.lepe"):
                s.update(conv_shapes(f"{b}.{name}", C, C, 3, groups=C))
            for name in ("norm1", "norm2"):
                s.update({f"{b}.{name}.weight": (C,), f"{b}.{name}.bias": (C,)})
            for name in ("in_proj", "act_proj", "out_proj"):
                s.update(linear_shapes(f"{b}.{name}", C, C))
            s.update(linear_shapes(f"{b}.attn.qk", C, 2 * C))
            s[f"{b}.attn.rope.rotations"] = (h, h, C // 2, 2)
            s.update(linear_shapes(f"{b}.mlp.fc1", C, 4 * C))
            s.update(linear_shapes(f"{b}.mlp.fc2", 4 * C, C))
        if i < len(depths) - 1:
            conv_layer(f"layers.{i}.downsample.conv.0", C, 8 * C, 1, bn=False)
            conv_layer(f"layers.{i}.downsample.conv.1", 8 * C, 8 * C, 3, groups=8 * C, bn=False)
            conv_layer(f"layers.{i}.downsample.conv.2", 8 * C, 2 * C, 1)
    C = D * 2 ** (len(depths) - 1)
    s.update({"norm.weight": (C,), "norm.bias": (C,)})
    s.update(linear_shapes("head", C, classes))
    return s


def rope_ref(x, h, w):
    """MLLA's RoPE over all C channels: pair m < C/4 turns by row * 10000^(-m/(C/4)), the others by column."""
    quarter = x.shape[-1] // 4
    theta = 10000.0 ** -(torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, cols = grid_axes(h, w)
    return rotate_pairs(x, torch.cat([rows * theta, cols * theta], dim=-1))


def attention_ref(sd, p, x, heads, h, w):
    """MLLA's LinearAttention: elu+1 of qk(x), RoPE'd numerator, plain normaliser, v = x, + LePE(x)."""
    B, n, C = x.shape
    qk = F.linear(x, sd[f"{p}.qk.weight"], sd[f"{p}.qk.bias"])
    q, k = F.elu(qk[..., :C]) + 1, F.elu(qk[..., C:]) + 1

    def split(t):
        return t.reshape(B, n, heads, -1).transpose(1, 2)

    qr, kr, q, k, v = split(rope_ref(q, h, w)), split(rope_ref(k, h, w)), split(q), split(k), split(x)
    z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
    out = (qr @ ((kr.transpose(-2, -1) / n**0.5) @ (v / n**0.5)) * z).transpose(1, 2).reshape(B, n, C)
    return out + tokens_conv(sd, f"{p}.lepe", x, h, w)


def tokens_conv(sd, prefix, x, h, w):
    B, n, C = x.shape
    return conv(sd, prefix, x.transpose(1, 2).reshape(B, C, h, w), groups=C).flatten(2).transpose(1, 2)


def block_ref(sd, b, x, heads, h, w):
    C = x.shape[-1]

    def lin(name, t):
        return F.linear(t, sd[f"{b}.{name}.weight"], sd[f"{b}.{name}.bias"])

    x = x + tokens_conv(sd, f"{b}.cpe1", x, h, w)
    u = F.layer_norm(x, (C,), sd[f"{b}.norm1.weight"], sd[f"{b}.norm1.bias"], 1e-5)
    gate = F.silu(lin("act_proj", u))
    a = F.silu(tokens_conv(sd, f"{b}.dwc", lin("in_proj", u), h, w))
    x = x + lin("out_proj", attention_ref(sd, f"{b}.attn", a, heads, h, w) * gate)
    x = x + tokens_conv(sd, f"{b}.cpe2", x, h, w)
    m = F.layer_norm(x, (C,), sd[f"{b}.norm2.weight"], sd[f"{b}.norm2.bias"], 1e-5)
    return x + lin("mlp.fc2", F.gelu(lin("mlp.fc1", m)))


def conv_layer_ref(sd, prefix, x, stride=1, groups=1, relu=True):
    y = conv(sd, f"{prefix}.conv", x, stride, groups)
    y = batch_norm(sd, f"{prefix}.norm", y) if f"{prefix}.norm.weight" in sd else y
    return F.relu(y) if relu else y


def stem_ref(sd, x):
    """conv1 (3x3/2); conv2 (3x3, 3x3) added to it; conv3 (3x3/2 to 4D, 1x1 to D); BN in each, no bias."""
    x = conv_layer_ref(sd, "patch_embed.conv1", x, 2)
    x = conv_layer_ref(sd, "patch_embed.conv2.1", conv_layer_ref(sd, "patch_embed.conv2.0", x), relu=False) + x
    return conv_layer_ref(sd, "patch_embed.conv3.1", conv_layer_ref(sd, "patch_embed.conv3.0", x, 2), relu=False)


def merging_ref(sd, p, x):
    """1x1 to 8C + ReLU, depthwise 3x3/2 + ReLU, 1x1 to 2C + BN."""
    x = conv_layer_ref(sd, f"{p}.conv.0", x)
    x = conv_layer_ref(sd, f"{p}.conv.1", x, 2, groups=x.shape[1])
    return conv_layer_ref(sd, f"{p}.conv.2", x, relu=False)


def mlla_ref(sd, x, depths, num_heads):
    x = stem_ref(sd, x)
    for i, depth in enumerate(depths):
        B, C, h, w = x.shape
        t = x.flatten(2).transpose(1, 2)
        for j in range(depth):
            t = block_ref(sd, f"layers.{i}.blocks.{j}", t, num_heads[i], h, w)
        x = t.transpose(1, 2).reshape(B, C, h, w)
        if i < len(depths) - 1:
            x = merging_ref(sd, f"layers.{i}.downsample", x)
    t = F.layer_norm(x.flatten(2).transpose(1, 2), (x.shape[1],), sd["norm.weight"], sd["norm.bias"], 1e-5)
    return F.linear(t.mean(dim=1), sd["head.weight"], sd["head.bias"])


def test_stem_and_merging_shapes():
    model = vitzoo.create_model("mlla_tiny", attention=None, num_classes=3)
    x = torch.randn(1, 3, 64, 96)
    assert model.patch_embed(x).shape == (1, 64, 16, 24)
    assert model.layers[0].downsample(torch.randn(1, 64, 16, 24)).shape == (1, 128, 8, 12)
    assert model.layers[0].downsample.conv[0].conv.weight.shape == (512, 64, 1, 1)  # 1x1 C -> 8C first
    assert model.patch_embed.conv1.conv.bias is None and model.layers[3].downsample is None


def test_official_state_dict_loads_strictly_and_gives_the_official_forward():
    """A reduced MLLA-T (depths 1-1-1-1) at a non-square 64 x 96 input, float64, official layout and formulas."""
    depths = (1, 1, 1, 1)
    shapes = official_shapes(64, depths, TINY["num_heads"], classes=5, grid=16)
    sd = random_state(shapes)
    model = vitzoo.create_model("mlla_tiny", attention=None, depths=depths, num_classes=5, img_size=64).double()
    model.load_state_dict(sd, strict=True)
    model.eval()
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), mlla_ref(sd, x, depths, TINY["num_heads"]))
    assert set(model.state_dict()) == {k.replace("attn.qk.", "attn.in_proj.proj.") for k in sd if "rope" not in k}


def test_full_size_official_layout_loads_strictly_and_its_count_is_the_official_one():
    shapes = official_shapes(**TINY)
    assert parameter_count(shapes) == 24_392_200  # the transcription is the official model's (PYRAMIDS.md 7)
    model = vitzoo.create_model("mlla_tiny", attention=None)
    model.load_state_dict(random_state(shapes), strict=True)


def test_attention_parameters_per_stage_are_the_officials():
    """PYRAMIDS.md section 8: MLLA-T's ``attn`` alone holds 8,960 / 34,304 / 134,144 / 530,432 per block."""
    model = vitzoo.create_model("mlla_tiny", attention=None)
    counts = [sum(p.numel() for p in stage.blocks[0].attn.parameters()) for stage in model.layers]
    assert counts == [8_960, 34_304, 134_144, 530_432]
    assert all(isinstance(b.attn, MllaAttention) and b.attn.bare for s in model.layers for b in s.blocks)


@pytest.mark.parametrize(
    "arch, gmacs", [("mlla_tiny", 4.131), pytest.param("mlla_small", 7.249, marks=pytest.mark.slow)]
)
def test_flops_at_224_are_the_official_models(arch, gmacs):
    check_gmacs(arch, gmacs)


def test_any_mechanism_per_stage_and_per_block():
    model = vitzoo.create_model(
        "mlla_tiny", attention=["mlla", "softmax", {"name": "rala"}, "softmax"], depths=(1, 1, 1, 1), img_size=64
    )
    kinds = [type(stage.blocks[0].attn) for stage in model.layers]
    assert kinds == [MllaAttention, SoftmaxAttention, RalaAttention, SoftmaxAttention]
    assert model.layers[0].blocks[0].attn.bare  # mlla in MLLA's block is its own layer unless bare is set
    model = timm.create_model("vitzoo_mlla_tiny", attention={":1": "softmax", "1:": "mlla"}, depths=(1, 1, 1, 1))
    assert [type(s.blocks[0].attn) for s in model.layers] == [SoftmaxAttention] + [MllaAttention] * 3
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
    with pytest.raises(ValueError, match="one\nper stage|one per stage"):
        vitzoo.create_model("mlla_tiny", attention=["mlla", "softmax"], depths=(1, 1, 1, 1))


def test_saved_state_dict_loads_as_pretrained_file_and_through_init_from(tmp_path):
    depths = (1, 1, 1, 1)
    sd = {k: v.float() for k, v in random_state(official_shapes(64, depths, TINY["num_heads"], classes=5)).items()}
    model = load_official_file("mlla_tiny", sd, tmp_path / "mlla.pth", depths, ["softmax", "softmax", "mlla", "mlla"])
    torch.testing.assert_close(
        model.layers[2].blocks[0].attn.in_proj.proj.weight, sd["layers.2.blocks.0.attn.qk.weight"]
    )


@pytest.mark.parametrize(
    "spec, fix",
    [({"name": "mlla", "bare": "yes"}, "give true"), ({"name": "mlla", "bare": True, "gate": "channel"}, "bare=False")],
)
def test_bad_bare_options_are_one_line(spec, fix):
    with pytest.raises(ValueError, match=fix) as err:
        vitzoo.create_model("mlla_tiny", attention=spec, depths=(1, 1, 1, 1))
    assert "\n" not in str(err.value)
