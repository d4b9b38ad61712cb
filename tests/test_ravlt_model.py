"""RAVLT-T / S (vitzoo.models.ravlt) and RAVLT's softmax (``ravlt_softmax``): a state dict in the official layout
(names transcribed from qhfan/RALA classfication/RALA.py) loads strictly and gives the official forward, written here
from its formulas in float64; the mechanism against its formula; the official parameter counts and FLOPs; any
mechanism per stage; features, smp, export."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

import vitzoo
from vitzoo.attention import RalaAttention, RavltSoftmaxAttention, SoftmaxAttention, build_attention
from staged_checks import (
    Shapes,
    batch_norm,
    bn_shapes,
    check_gmacs,
    conv,
    conv_shapes,
    grid_axes,
    load_official_file,
    parameter_count,
    random_state,
    rotate_pairs,
)

TINY = dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 6, 2), num_heads=(1, 2, 4, 8))
FLAGS = ("l", "l", "v", "v")  # RAVLT's default flags: RALA in stages 1-2, VanillaSelfAttention in 3-4


def official_shapes(embed_dims, depths, num_heads, classes=1000, ratio=3.5) -> Shapes:
    """The official RAVLT's state dict: names and shapes (RALA.py, PYRAMIDS.md section 6)."""
    half = embed_dims[0] // 2
    s: Shapes = {}
    for index, (cin, cout, bn) in enumerate(
        [(3, half, 1), (half, half, 4), (half, half, 7), (half, embed_dims[0], 10)]
    ):
        s.update(conv_shapes(f"patch_embed.proj.{3 * index}", cin, cout, 3))
        s.update(bn_shapes(f"patch_embed.proj.{bn}", cout))
    for i, (C, depth, heads) in enumerate(zip(embed_dims, depths, num_heads)):
        hidden = int(ratio * C)
        s[f"layers.{i}.RoPE.angle"] = (C // heads // 2,)
        for j in range(depth):
            b = f"layers.{i}.blocks.{j}"
            for name in ("norm1.norm", "norm2.norm"):
                s.update({f"{b}.{name}.weight": (C,), f"{b}.{name}.bias": (C,)})
            s.update(conv_shapes(f"{b}.attn.qkvo", C, 4 * C, 1))
            s.update(conv_shapes(f"{b}.attn.lepe", C, C, 5, groups=C))
            s.update(conv_shapes(f"{b}.attn.proj", C, C, 1))
            s.update(conv_shapes(f"{b}.ffn.fc1", C, hidden, 1))
            s.update(conv_shapes(f"{b}.ffn.fc2", hidden, C, 1))
            s.update(conv_shapes(f"{b}.ffn.dwconv", hidden, hidden, 3, groups=hidden))
            s.update(conv_shapes(f"{b}.pos", C, C, 3, groups=C))
            s.update({f"{b}.gamma_1": (1, C, 1, 1), f"{b}.gamma_2": (1, C, 1, 1)})
        if i < len(depths) - 1:
            s.update(conv_shapes(f"layers.{i}.downsample.reduction", C, embed_dims[i + 1], 3))
            s.update(bn_shapes(f"layers.{i}.downsample.norm", embed_dims[i + 1]))
    s.update(conv_shapes("proj", embed_dims[-1], 1024, 1))
    s.update(bn_shapes("norm", 1024))
    s.update(conv_shapes("head", 1024, classes, 1))
    return s


def rala_rope_ref(x, h, w):
    """RALA's RoPE per head: pairs of channels [0, d/2) turn by row * omega_k, [d/2, d) by column * omega_k,
    omega_k = 1 / 10000^linspace(0, 1, d/4)."""
    omega = 1.0 / 10000 ** torch.linspace(0, 1, x.shape[-1] // 4, dtype=torch.float64)
    rows, cols = grid_axes(h, w)
    return rotate_pairs(x, torch.cat([rows * omega, cols * omega], dim=-1))


def attention_ref(sd, p, x, heads, flag):
    """GateLinearAttentionNoSilu ('l') or VanillaSelfAttention ('v') on an NCHW map, from the formulas."""
    B, C, h, w = x.shape
    n, d = h * w, C // heads
    qkvo = conv(sd, f"{p}.qkvo", x)
    q, k, v = (qkvo[:, i * C : (i + 1) * C].reshape(B, heads, d, n).transpose(-2, -1) for i in range(3))
    lepe = conv(sd, f"{p}.lepe", qkvo[:, 2 * C : 3 * C], groups=C)
    if flag == "l":
        q, k = F.elu(q) + 1, F.elu(k) + 1
        alpha = torch.softmax(d**-0.5 * q.mean(dim=-2, keepdim=True) @ k.transpose(-2, -1), dim=-1)
        k = k * alpha.transpose(-2, -1) * n
        z = 1 / (q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
        kv = (rala_rope_ref(k, h, w).transpose(-2, -1) / n**0.5) @ (v / n**0.5)
        out = rala_rope_ref(q, h, w) @ kv * z
    else:
        logits = d**-0.5 * rala_rope_ref(q, h, w) @ rala_rope_ref(k, h, w).transpose(-2, -1)
        out = torch.softmax(logits, dim=-1) @ v
    out = out.transpose(-2, -1).reshape(B, C, h, w) + lepe
    return conv(sd, f"{p}.proj", out * qkvo[:, 3 * C :])


def layer_norm_2d(sd, p, x):
    return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), sd[f"{p}.weight"], sd[f"{p}.bias"], 1e-6).permute(
        0, 3, 1, 2
    )


def ravlt_ref(sd, x, depths, num_heads):
    for index in range(4):
        x = batch_norm(
            sd,
            f"patch_embed.proj.{3 * index + 1}",
            conv(sd, f"patch_embed.proj.{3 * index}", x, 2 if index in (0, 3) else 1),
        )
        x = F.gelu(x) if index < 3 else x
    for i, depth in enumerate(depths):
        for j in range(depth):
            b = f"layers.{i}.blocks.{j}"
            x = x + conv(sd, f"{b}.pos", x, groups=x.shape[1])
            x = x + sd[f"{b}.gamma_1"] * attention_ref(
                sd, f"{b}.attn", layer_norm_2d(sd, f"{b}.norm1.norm", x), num_heads[i], FLAGS[i]
            )
            u = F.gelu(conv(sd, f"{b}.ffn.fc1", layer_norm_2d(sd, f"{b}.norm2.norm", x)))
            u = u + conv(sd, f"{b}.ffn.dwconv", u, groups=u.shape[1])
            x = x + sd[f"{b}.gamma_2"] * conv(sd, f"{b}.ffn.fc2", u)
        if i < len(depths) - 1:
            x = batch_norm(sd, f"layers.{i}.downsample.norm", conv(sd, f"layers.{i}.downsample.reduction", x, 2))
    x = batch_norm(sd, "norm", conv(sd, "proj", x))
    x = (x * torch.sigmoid(x)).mean(dim=(2, 3), keepdim=True)
    return conv(sd, "head", x).flatten(1)


def tokens_ref(layer, x, prefix, h, w):
    """The same on (B, prefix + h*w, C) tokens: prefix tokens unrotated, keys among all, no LePE term."""
    B, N, C = x.shape
    heads, d = layer.num_heads, layer.head_dim
    q, k, v = (
        F.linear(x, layer.in_proj.proj.weight, layer.in_proj.proj.bias)
        .reshape(B, N, 3, heads, d)
        .permute(2, 0, 3, 1, 4)
    )
    rq, rk = (torch.cat([t[:, :, :prefix], rala_rope_ref(t[:, :, prefix:], h, w)], dim=2) for t in (q, k))
    out = (torch.softmax(d**-0.5 * rq @ rk.transpose(-2, -1), dim=-1) @ v).transpose(1, 2).reshape(B, N, C)
    lepe = F.conv2d(
        v[:, :, prefix:].transpose(-2, -1).reshape(B, C, h, w), layer.lepe.weight, layer.lepe.bias, padding=2, groups=C
    )
    out = out + F.pad(lepe.flatten(2).transpose(1, 2), (0, 0, prefix, 0))
    return F.linear(out * F.linear(x, layer.gate.weight, layer.gate.bias), layer.proj.weight, layer.proj.bias)


@pytest.mark.parametrize("prefix", [0, 1])
def test_ravlt_softmax_is_the_float64_formula(prefix):
    """y = proj((softmax(tau (R q)(R k)^T) V + LePE(V)) * o) on a non-square 3 x 5 grid; without prefix tokens also
    against VanillaSelfAttention's formula written on NCHW maps from its qkvo / proj convs."""
    layer = build_attention("ravlt_softmax", 16, num_heads=2, qkv_bias=True, num_prefix_tokens=prefix).double()
    layer.token_grid = (3, 5)
    x = torch.randn(2, prefix + 15, 16, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x)
    torch.testing.assert_close(out, tokens_ref(layer, x, prefix, 3, 5))
    if prefix == 0:
        sd = {
            "a.qkvo.weight": torch.cat([layer.in_proj.proj.weight, layer.gate.weight])[..., None, None],
            "a.qkvo.bias": torch.cat([layer.in_proj.proj.bias, layer.gate.bias]),
            "a.lepe.weight": layer.lepe.weight,
            "a.lepe.bias": layer.lepe.bias,
            "a.proj.weight": layer.proj.weight[..., None, None],
            "a.proj.bias": layer.proj.bias,
        }
        expected = attention_ref(sd, "a", x.transpose(1, 2).reshape(2, 16, 3, 5), 2, "v")
        torch.testing.assert_close(out, expected.flatten(2).transpose(1, 2))


def test_ravlt_softmax_probs_are_the_rotated_softmax_and_options_are_checked():
    layer = build_attention({"name": "ravlt_softmax", "kernel_size": 0}, 16, num_heads=2).double()
    layer.token_grid = (4, 4)
    x = torch.randn(1, 16, 16, dtype=torch.float64)
    q, k, _ = layer.project(x)
    expected = torch.softmax(8**-0.5 * rala_rope_ref(q, 4, 4) @ rala_rope_ref(k, 4, 4).transpose(-2, -1), dim=-1)
    torch.testing.assert_close(layer.probs(x, q, k, None, False, torch.arange(16)), expected)
    assert layer.lepe is None
    with pytest.raises(ValueError, match="multiple of 4"):
        build_attention("ravlt_softmax", 12, num_heads=2)
    with pytest.raises(ValueError, match="LePE"):
        layer(x, is_causal=True)


def test_official_state_dict_loads_strictly_and_gives_the_official_forward():
    """A reduced RAVLT-T (depths 1-1-1-1) at a non-square 64 x 96 input, float64, official layout and formulas."""
    depths = (1, 1, 1, 1)
    sd = random_state(official_shapes(TINY["embed_dims"], depths, TINY["num_heads"], classes=5))
    model = vitzoo.create_model("ravlt_tiny", attention=None, depths=depths, num_classes=5).double()
    model.load_state_dict(sd, strict=True)
    model.eval()
    x = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ravlt_ref(sd, x, depths, TINY["num_heads"]))


def test_full_size_official_layout_loads_strictly_and_its_count_is_the_official_one():
    shapes = official_shapes(**TINY)
    assert parameter_count(shapes) == 14_897_768  # the transcription is the official model's (PYRAMIDS.md 7)
    vitzoo.create_model("ravlt_tiny", attention=None).load_state_dict(random_state(shapes), strict=True)


def test_stage_mechanisms_and_attention_parameters_are_the_officials():
    """PYRAMIDS.md section 8: 22,464 / 85,888 / 335,616 / 1,326,592 per block; RALA in 1-2, softmax in 3-4."""
    model = vitzoo.create_model("ravlt_tiny", attention=None)
    counts = [sum(p.numel() for p in stage.blocks[0].attn.parameters()) for stage in model.layers]
    assert counts == [22_464, 85_888, 335_616, 1_326_592]
    kinds = [type(stage.blocks[0].attn) for stage in model.layers]
    assert kinds == [RalaAttention, RalaAttention, RavltSoftmaxAttention, RavltSoftmaxAttention]
    assert all(
        torch.equal(b.gamma_1.detach(), torch.ones_like(b.gamma_1))
        and torch.equal(b.gamma_2.detach(), b.gamma_1.detach())
        for s in model.layers
        for b in s.blocks
    )


@pytest.mark.parametrize(
    "arch, gmacs", [("ravlt_tiny", 2.613), pytest.param("ravlt_small", 4.878, marks=pytest.mark.slow)]
)
def test_flops_at_224_are_the_official_models(arch, gmacs):
    """Counted as PYRAMIDS.md section 7 counts the official model: the softmax stages' matrices formed (fused off)."""
    spec = {"name": "ravlt_softmax", "fused": False}
    check_gmacs(arch, gmacs, attention=["rala", "rala", spec, spec])


def test_any_mechanism_per_stage():
    model = timm.create_model("vitzoo_ravlt_tiny", attention="softmax", depths=(1, 1, 1, 1), num_classes=3)
    assert all(type(s.blocks[0].attn) is SoftmaxAttention for s in model.layers)
    assert model(torch.randn(1, 3, 64, 64)).shape == (1, 3)


def test_saved_state_dict_loads_as_pretrained_file_and_through_init_from(tmp_path):
    depths = (1, 1, 1, 1)
    sd = random_state(official_shapes(TINY["embed_dims"], depths, TINY["num_heads"], classes=5))
    sd = {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}
    own = {"name": "ravlt_softmax", "kernel_size": 5}
    model = load_official_file("ravlt_tiny", sd, tmp_path / "ravlt.pth", depths, ["softmax", "softmax", own, own])
    attn = model.layers[2].blocks[0].attn
    torch.testing.assert_close(attn.gate.weight, sd["layers.2.blocks.0.attn.qkvo.weight"][3 * 256 :, :, 0, 0])
