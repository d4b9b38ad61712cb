"""The pyramid backbones (PVT v1, PVTv2, Swin and the published releases): timm's and the official state dicts,
a mechanism per stage, spatial reduction and windows against float64 references, features, timm names, smp."""

from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F

import vitzoo
from conftest import CONFIGS
from pyramid_checks import SMALL, small_pyramid
from vitzoo.attention import ZooAttention, build_attention, resolve_attention
from vitzoo.models.releases import RELEASES

TIMM_TWIN = {"pvt_v2_b0": "pvt_v2_b0", "swin_tiny": "swin_tiny_patch4_window7_224"}


def small(arch, **kwargs):
    return small_pyramid(arch, **kwargs)


def layers(model):
    return [m for m in model.modules() if isinstance(m, ZooAttention)]


# -- timm's and the official state dicts -------------------------------------------------------------
@pytest.mark.parametrize("arch", sorted(TIMM_TWIN))
def test_softmax_pyramid_loads_timms_state_dict_strictly_and_equals_timm(arch):
    torch.manual_seed(0)
    kwargs = {**SMALL[arch], "img_size": 64} if arch.startswith("swin") else SMALL[arch]
    ref = timm.create_model(TIMM_TWIN[arch], **kwargs).double().eval()
    ours = small(arch).double().eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=1e-12)
    assert not isinstance(timm.create_model(TIMM_TWIN[arch], **kwargs), type(ours))  # timm's own name is timm's


def _official_pvt_keys(model):
    """Our PVT state dict under the official pvt.py names: q and kv split, sr / norm of the spatial reduction."""
    out = {}
    for key, value in model.state_dict().items():
        if ".attn.in_proj.proj." in key:
            base, kind = key.split(".attn.in_proj.proj.")
            dim = value.shape[0] // 3
            out[f"{base}.attn.q.{kind}"], out[f"{base}.attn.kv.{kind}"] = value[:dim], value[dim:]
        else:
            out[key.replace(".attn.sr.sr.", ".attn.sr.").replace(".attn.sr.norm.", ".attn.norm.")] = value
    return out


def test_pvt_v1_loads_a_state_dict_in_the_official_layout(tmp_path):
    torch.manual_seed(0)
    source = small("pvt_tiny").eval()
    official = _official_pvt_keys(source)
    # the official pvt.py names of stage 1's first block and the model's own tensors (transcribed)
    assert {k for k in official if k.startswith("block1.0.")} == {
        f"block1.0.{name}.{kind}"
        for name in ("norm1", "attn.q", "attn.kv", "attn.proj", "attn.sr", "attn.norm", "norm2", "mlp.fc1", "mlp.fc2")
        for kind in ("weight", "bias")
    }
    assert {"patch_embed1.proj.weight", "pos_embed1", "pos_embed4", "cls_token", "norm.weight", "head.weight"} <= set(
        official
    )
    assert official["pos_embed4"].shape == (1, 1 + 2 * 2, 64)  # 2x2 grid at 64 px, the class row first
    torch.save(official, tmp_path / "pvt_official.pth")
    target = small("pvt_tiny").eval()
    target.load_state_dict(torch.load(tmp_path / "pvt_official.pth", weights_only=True), strict=True)
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(target(x), source(x))


def test_release_drops_the_official_unused_final_norm():
    model = vitzoo.create_model("flatten_pvt_tiny", img_size=64, **SMALL["pvt_tiny"])
    state = {**model.state_dict(), "norm.weight": torch.ones(64), "norm.bias": torch.zeros(64)}
    from vitzoo.models.pvt import _checkpoint_filter

    model.load_state_dict(_checkpoint_filter(state, model), strict=True)


# -- spatial reduction and windows against float64 references ------------------------------------------
def _layer(spec, dim=8, heads=2, grid=(6, 6), block_index=0):
    torch.manual_seed(0)
    layer = build_attention(spec, dim, num_heads=heads, qkv_bias=True, num_tokens=grid[0] * grid[1], grid_size=grid)
    layer.token_grid, layer.block_index = grid, block_index
    return layer.double().eval()


def _qkv_reduced(layer, x, grid, reduce):
    """q of x, k and v of the reduced grid, by the formula: (B, H, n, d) each."""
    B, N, C = x.shape
    W, b = layer.in_proj.proj.weight, layer.in_proj.proj.bias
    xr = reduce(x.transpose(1, 2).reshape(B, C, *grid)).flatten(2).transpose(1, 2)
    q = x @ W[:C].T + b[:C]
    kv = xr @ W[C:].T + b[C:]
    heads = layer.num_heads
    split = lambda t: t.reshape(B, t.shape[1], -1, C // heads).transpose(1, 2)  # noqa: E731
    return split(q), split(kv[..., :C]), split(kv[..., C:])


def test_sr_ratio_is_pvts_spatial_reduction_attention():
    grid = (6, 6)
    layer = _layer({"name": "softmax", "sr_ratio": 2}, grid=grid)
    x = torch.randn(2, 36, 8, dtype=torch.float64)
    sr = layer.sr

    def reduce(g):
        g = F.conv2d(g, sr.sr.weight, sr.sr.bias, stride=2)
        return F.layer_norm(g.transpose(1, 3), (8,), sr.norm.weight, sr.norm.bias).transpose(1, 3)

    q, k, v = _qkv_reduced(layer, x, grid, reduce)
    assert k.shape[2] == 9
    attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(4), dim=-1)
    expected = (attn @ v).transpose(1, 2).reshape(2, 36, 8) @ layer.proj.weight.T + layer.proj.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)


def test_an_input_too_small_for_the_reduction_is_one_line():
    with pytest.raises(ValueError, match="sr_ratio=8 needs a grid of at least 8x8 tokens, and this input gives 4x4"):
        small("pvt_v2_b0")(torch.randn(1, 3, 16, 16))


def test_sr_pool_is_pvt_v2s_linear_reduction_under_linear_attention():
    grid = (6, 6)
    layer = _layer({"name": "linear", "sr_pool": 2, "impl": "eager"}, grid=grid)
    x = torch.randn(2, 36, 8, dtype=torch.float64)
    sr = layer.sr

    def reduce(g):
        g = F.conv2d(F.adaptive_avg_pool2d(g, 2), sr.sr.weight, sr.sr.bias)
        return F.gelu(F.layer_norm(g.transpose(1, 3), (8,), sr.norm.weight, sr.norm.bias)).transpose(1, 3)

    q, k, v = _qkv_reduced(layer, x, grid, reduce)
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    out = (fq @ (fk.transpose(-2, -1) @ v)) / (fq @ fk.sum(-2, keepdim=True).transpose(-2, -1) + 1e-6)
    expected = out.transpose(1, 2).reshape(2, 36, 8) @ layer.proj.weight.T + layer.proj.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shifted", [False, True])
def test_window_runs_any_mechanism_in_swins_cyclically_shifted_regions(shifted):
    """Reference: Swin's own recipe, written independently: roll the grid by -w//2, cut w x w windows, and within a
    window let tokens attend only inside their region (Swin's mask: slices :-w, -w:-s, -s: per axis)."""
    h, w_grid, w = 6, 9, 3
    layer = _layer({"name": "linear", "window": w, "impl": "eager"}, grid=(h, w_grid), block_index=int(shifted))
    x = torch.randn(2, h * w_grid, 8, dtype=torch.float64)
    q, k, v = layer.project(x)
    s = w // 2 if shifted else 0

    def region(i, n):
        return 0 if i < n - w else (1 if i < n - s else 2)

    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w_grid), indexing="ij")
    rolled_r, rolled_c = (rows - s) % h, (cols - s) % w_grid  # a token's place on the rolled grid
    group = {}
    for r in range(h):
        for c in range(w_grid):
            pr, pc = int(rolled_r[r, c]), int(rolled_c[r, c])
            key = (pr // w, pc // w, region(pr, h) if s else 0, region(pc, w_grid) if s else 0)
            group.setdefault(key, []).append(r * w_grid + c)
    out = torch.zeros_like(v)
    for index in group.values():
        fq, fk, vv = F.elu(q[:, :, index]) + 1, F.elu(k[:, :, index]) + 1, v[:, :, index]
        out[:, :, index] = (fq @ (fk.transpose(-2, -1) @ vv)) / (fq @ fk.sum(-2, keepdim=True).transpose(-2, -1) + 1e-6)
    expected = out.transpose(1, 2).reshape(2, h * w_grid, 8) @ layer.proj.weight.T + layer.proj.bias
    torch.testing.assert_close(layer(x), expected, rtol=1e-10, atol=1e-10)


def test_a_window_holding_the_grid_is_the_mechanism_itself():
    a = _layer({"name": "focused_linear", "window": 8}, grid=(6, 6))
    b = _layer({"name": "focused_linear"}, grid=(6, 6))
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 36, 8, dtype=torch.float64)
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)


# -- a mechanism per stage -----------------------------------------------------------------------------
# PVTv2 (spatial reduction) in the fast run; PVT v1 and Swin (windows) in the slow one
EVERY_MECHANISM = [
    pytest.param(arch, name, marks=() if arch == "pvt_v2_b0" else pytest.mark.slow, id=f"{name}-{arch}")
    for arch in sorted(SMALL)
    for name in vitzoo.list_attentions()
]


@pytest.mark.parametrize("arch, name", EVERY_MECHANISM)
def test_every_mechanism_runs_in_every_pyramid_or_refuses_naming_the_stage(arch, name):
    try:
        model = small(arch, attention=name)
    except ValueError as err:
        assert str(err).startswith("stage ") and name.replace("_", "") in str(err).lower().replace("_", "")
        return
    expected = resolve_attention(name)[0]
    if arch.startswith("swin") and name == "softmax":
        expected = resolve_attention("window")[0]  # Swin's softmax: windows with the relative position bias
    assert all(type(m) is expected for m in layers(model))
    for size in (64, 96):
        try:
            out = model(torch.randn(2, 3, size, size))
        except ValueError as err:  # a mechanism that cannot leave window padding out says so in one line
            assert "window" in str(err) and "\n" not in str(err)
            continue
        assert out.shape == (2, 5) and torch.isfinite(out).all()
        out.square().mean().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_one_spec_per_stage_and_per_block_and_the_stage_defaults():
    model = small("pvt_v2_b0", attention=["linear", "focused_linear", {"name": "softmax", "sr_ratio": 1}, "agent"])
    kinds = [[type(b.attn).__name__ for b in stage.blocks] for stage in model.stages]
    assert kinds == [
        ["LinearAttention"] * 2,
        ["FocusedLinearAttention"] * 2,
        ["SoftmaxAttention"] * 2,
        ["AgentAttention"] * 2,
    ]
    assert model.stages[0].blocks[0].attn.sr.ratio == 8  # the stage's SR reaches a mechanism that reduces keys
    assert model.stages[1].blocks[0].attn.sr is None and model.stages[2].blocks[0].attn.sr is None
    per_block = small("pvt_tiny", attention={":2": "linear", "2:": "softmax"})
    assert [type(b.attn).__name__ for b in per_block.block1] == ["LinearAttention"] * 2
    assert [type(b.attn).__name__ for b in per_block.block2] == ["SoftmaxAttention"] * 2
    swin = small("swin_tiny", attention=["linear", {"name": "linear", "window": 2}, "softmax", "softmax"])
    assert [swin.layers[s].blocks[0].attn.window for s in range(2)] == [4, 2]
    assert swin.layers[2].blocks[0].attn.rel_table is not None  # Swin's softmax
    with pytest.raises(ValueError, match=r"^stage 1 .*Agent.*spatial reduction"):
        small("pvt_tiny", attention={"name": "agent", "sr_ratio": 2})
    with pytest.raises(ValueError, match="3 entries for 4 stages"):
        small("pvt_tiny", attention=["linear"] * 3)


@pytest.mark.parametrize("arch", ["pvt_tiny", "pvt_v2_b0", "swin_tiny", "flatten_pvt_tiny", "agent_swin_tiny"])
def test_features_only_at_strides_4_to_32_through_timms_prefixed_name(arch):
    base = arch if arch in SMALL else ("pvt_tiny" if "pvt" in arch else "swin_tiny")
    model = timm.create_model(f"vitzoo_{arch}", features_only=True, img_size=64, **SMALL[base])
    assert model.feature_info.reduction() == [4, 8, 16, 32]
    feats = model(torch.randn(1, 3, 96, 96))
    sides = [f.shape[1] if base.startswith("swin") else f.shape[-1] for f in feats]
    assert sides == [24, 12, 6, 3]
    assert timm.list_models(f"vitzoo_{arch}") == [f"vitzoo_{arch}"] and arch in vitzoo.list_models()


def test_pvt_position_tables_resample_at_another_input_size():
    model = small("pvt_tiny").eval()
    intermediates = model.forward_intermediates(torch.randn(1, 3, 128, 96), intermediates_only=True)
    assert [tuple(t.shape[-2:]) for t in intermediates] == [(32, 24), (16, 12), (8, 6), (4, 3)]
    torch.testing.assert_close(model._pos_embed(3, (2, 2)), model.pos_embed4)  # the built size: the table itself


def test_pvt_forward_intermediates_ends_where_forward_features_does():
    model = small("pvt_tiny").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=[1, 3], norm=True)
        torch.testing.assert_close(final, model.forward_features(x))  # stage 4's normed tokens, class token first
        torch.testing.assert_close(maps[1], final[:, 1:].transpose(1, 2).reshape(2, -1, 2, 2))
        early, (second,) = model.forward_intermediates(x, indices=[1], stop_early=True)
    torch.testing.assert_close(early, second)  # stopped after stage 2: its map, not normed
    with pytest.raises(ValueError, match=r"PyramidVisionTransformer's stage outputs are NCHW maps"):
        model.forward_intermediates(x, output_fmt="NLC")


# -- published presets ----------------------------------------------------------------------------------
OFFICIAL_PARAMS = {
    "pvt_tiny": 13_229_288,
    "pvt_v2_b0": 3_666_760,
    "swin_tiny": 28_288_354,
    "flatten_pvt_tiny": 12_150_504,
    "agent_pvt_tiny": 11_570_352,
    "inline_pvt_tiny": 12_032_232,
    "pola_pvt_tiny": 12_924_648,
    "flatten_swin_tiny": 29_192_384,
    "agent_swin_tiny": 28_902_964,
    "inline_swin_tiny": 29_223_544,
    "pola_swin_tiny": 29_285_696,
}


@pytest.mark.parametrize("arch", sorted(OFFICIAL_PARAMS))
def test_preset_parameters_equal_the_official_models(arch):
    """Within 0.5% of the official model built from its own code (docs/pyramids.md; FLOPs: the slow test below)."""
    with torch.device("meta"):
        model = vitzoo.create_model(arch)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - OFFICIAL_PARAMS[arch]) / OFFICIAL_PARAMS[arch] < 0.005


@pytest.mark.slow
def test_preset_flops_equal_the_official_models():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    from pyramid_counts import OFFICIAL, count

    for arch in ("pvt_tiny", "flatten_pvt_tiny", "agent_swin_tiny", "pola_swin_tiny"):
        params, gmacs = count(arch)
        assert abs(gmacs - OFFICIAL[arch].gmacs) / OFFICIAL[arch].gmacs < 0.02, arch


# -- smp --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arch",
    [pytest.param("pvt_v2_b0", marks=pytest.mark.slow), "swin_tiny", pytest.param("pvt_tiny", marks=pytest.mark.slow)],
)
def test_smp_universal_encoder_trains_a_unet_on_a_vitzoo_pyramid(arch):
    smp = pytest.importorskip("segmentation_models_pytorch")
    torch.manual_seed(0)
    kwargs = {k: v for k, v in SMALL[arch].items() if k != "num_classes"}
    model = smp.Unet(
        f"tu-vitzoo_{arch}",
        encoder_weights=None,
        classes=2,
        decoder_channels=(32, 16, 8, 8, 8),
        encoder_depth=5 if arch.startswith("pvt_v2") else 5,
        img_size=64,
        attention="linear",
        **kwargs,
    )
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 2, (2, 64, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert model(x).shape == (2, 2, 64, 64) and losses[-1] < losses[0]
    assert any(type(m).__name__ == "LinearAttention" for m in model.encoder.modules())


@pytest.mark.parametrize("arch", sorted(RELEASES))
def test_release_preset_spells_out_the_architectures_own_mix(arch):
    from omegaconf import OmegaConf

    preset = OmegaConf.to_container(OmegaConf.load(CONFIGS / "model" / f"{arch}.yaml"))
    assert preset["arch"] == arch and preset["attention"] == RELEASES[arch][1]


def test_a_windowed_layers_probe_sees_its_windows():
    """The implied matrix of any mechanism in windows: rows sum to 1 and reach exactly the keys of the query's window
    (the ``window`` mechanism's support)."""
    from vitzoo.diagnostics import capture_attention

    model = small("swin_tiny", attention=["linear", "softmax", "softmax", "softmax"]).eval()
    swin = small("swin_tiny").eval()
    x = torch.randn(1, 3, 64, 64)
    with capture_attention(model) as maps, capture_attention(swin) as swin_maps:
        model(x), swin(x)
    for name in ("layers.0.blocks.0.attn", "layers.0.blocks.1.attn"):  # unshifted, shifted
        torch.testing.assert_close(maps[name].sum(-1), torch.ones(1, 1, 256))
        assert torch.equal(maps[name] > 0, swin_maps[name] > 0)


# -- init_from and attention transfer ------------------------------------------------------------------------------
def test_init_from_timms_softmax_pyramid_into_any_mechanism_per_stage(tmp_path):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    teacher = timm.create_model("pvt_v2_b0", **SMALL["pvt_v2_b0"]).eval()
    save_file(teacher.state_dict(), tmp_path / "pvt_v2.safetensors")
    same = small("pvt_v2_b0", init_from=tmp_path / "pvt_v2.safetensors").eval()
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(same(x), teacher(x), rtol=0, atol=0)
    student = small("pvt_v2_b0", attention=["focused_linear", "linear", "softmax", "softmax"])
    report = vitzoo.models.initialise_from(student, tmp_path / "pvt_v2.safetensors")
    stage1, stage2 = student.stages[0].blocks[0].attn, student.stages[1].blocks[0].attn
    q, kv = (teacher.state_dict()[f"stages.0.blocks.0.attn.{n}.weight"] for n in ("q", "kv"))
    torch.testing.assert_close(stage1.in_proj.proj.weight, torch.cat([q, kv]), rtol=0, atol=0)
    assert "stages.0.blocks.0.attn.pos.weight" in report.new  # FLatten's own table keeps its init
    assert "stages.0.blocks.0.attn.sr.weight" in report.unused  # FLatten takes no spatial reduction
    assert stage2.sr is not None and "stages.1.blocks.0.attn.sr.sr.weight" in report.loaded  # linear keeps PVT's SR
    with pytest.raises(ValueError, match="not this ZooSwinTransformer's family or shape"):
        vitzoo.models.initialise_from(small("swin_tiny"), tmp_path / "pvt_v2.safetensors")


def test_transfer_teaches_a_pyramids_converted_stages_only(tmp_path):
    from safetensors.torch import save_file
    from vitzoo.training.transfer import AttentionTransfer, attention_layers

    torch.manual_seed(0)
    state = small("swin_tiny").state_dict()
    for name in [n for n in state if n.endswith("attn.in_proj.proj.weight")]:  # sharp softmax rows to learn
        state[name] = torch.cat(
            [state[name][: 2 * (len(state[name]) // 3)] * 30, state[name][2 * (len(state[name]) // 3) :]]
        )
    save_file(state, tmp_path / "swin.safetensors")
    module = AttentionTransfer(
        arch="swin_tiny",
        attention=["linear", "linear", "softmax", "softmax"],
        num_classes=5,
        img_size=64,
        model_kwargs={k: v for k, v in SMALL["swin_tiny"].items() if k != "num_classes"},
        transfer={"stage": 1},
    )
    module.initialise(str(tmp_path / "swin.safetensors"))
    student, teacher = attention_layers(module.model), attention_layers(module.teacher)
    assert module.converted == [0, 1, 2, 3]  # stages 1-2 (2 blocks each); Swin's own stages 3-4 are the teacher's
    images = torch.randn(4, 3, 64, 64)
    optimizer = torch.optim.Adam([p for p in module.model.parameters() if p.requires_grad], lr=1e-3)
    frozen = {n: t.clone() for n, t in module.model.layers[2].state_dict().items()}
    losses = []
    for _ in range(5):
        loss = torch.stack(list(module.transfer_losses(images).values())).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(torch.equal(frozen[n], t) for n, t in module.model.layers[2].state_dict().items())
    torch.testing.assert_close(student[4].rel_table, teacher[4].rel_table, rtol=0, atol=0)


# -- dense prediction ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", [pytest.param("pvt_tiny", marks=pytest.mark.slow), "swin_tiny"])
def test_vitzoos_segmentation_takes_a_pyramid_export_and_learns(arch, tmp_path):
    """The export's four levels feed vitzoo's decoder directly (no simple_fpn), Swin's channels-last maps too."""
    from vitzoo.export import export_model
    from vitzoo.segmentation.model import SegmentationNet, create_backbone

    torch.manual_seed(0)
    export_model(small(arch, attention="linear"), tmp_path / "export", head=False)
    net = SegmentationNet(create_backbone(str(tmp_path / "export")), num_classes=2, channels=16)
    with pytest.raises(ValueError, match="has its own"):
        SegmentationNet(create_backbone(str(tmp_path / "export")), num_classes=2, neck="simple_fpn")
    images, masks = 0.3 * torch.rand(4, 3, 64, 64), torch.zeros(4, 64, 64, dtype=torch.long)
    for i, (r, c) in enumerate([(4, 8), (24, 40), (40, 4), (12, 28)]):  # a bright square on each image
        images[i, :, r : r + 20, c : c + 20], masks[i, r : r + 20, c : c + 20] = 1.0, 1
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        loss = F.cross_entropy(net(images), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert net(images).shape == (4, 2, 64, 64) and losses[-1] < 0.7 * losses[0]


def test_smp_fpn_on_a_swin_with_a_mechanism_per_stage():
    smp = pytest.importorskip("segmentation_models_pytorch")
    kwargs = {k: v for k, v in SMALL["swin_tiny"].items() if k != "num_classes"}
    net = smp.FPN(
        "tu-vitzoo_swin_tiny",
        encoder_weights=None,
        classes=2,
        decoder_pyramid_channels=32,
        decoder_segmentation_channels=32,
        img_size=64,
        attention=["linear", "focused_linear", "softmax", "softmax"],
        **kwargs,
    )
    out = net(torch.randn(2, 3, 64, 64))
    assert out.shape == (2, 2, 64, 64) and torch.isfinite(out).all()
    names = {type(m).__name__ for m in net.encoder.modules()}
    assert {"LinearAttention", "FocusedLinearAttention", "WindowAttention"} <= names
