"""init_from a timm RoPE ViT (Eva: the naver ROPE-ViTs, axial and mixed, the sbb reg/gap ones, DINOv3): timm's
logits back with softmax + the same RoPE, any mechanism with that RoPE, and one line for what does not map."""

from __future__ import annotations

from functools import partial

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitzoo
from vitzoo.models import initialise_from
from vitzoo.models import pretrained_sources

TINY = dict(embed_dim=32, depth=2, num_heads=2, img_size=32, patch_size=8, num_classes=5)
NAVER_AXIAL = {"name": "axial", "base": 100.0, "indexing": "xy"}
NAVER_MIXED = {"name": "mixed", "indexing": "xy"}
# timm architecture -> the vitzoo ViT options that rebuild it (besides TINY)
CASES = {
    "vit_small_patch16_rope_224": dict(rope=NAVER_AXIAL, pos_embed="none", init_values=1e-5),
    "vit_small_patch16_rope_mixed_224": dict(rope=NAVER_MIXED, pos_embed="none", init_values=1e-5),
    "vit_small_patch16_rope_mixed_ape_224": dict(rope=NAVER_MIXED, init_values=1e-5, no_embed_class=True),
    "vit_base_patch16_rope_reg1_gap_256": dict(
        rope={"name": "axial", "ref_grid": (4, 4)},
        pos_embed="none",
        init_values=1e-5,
        class_token=False,
        reg_tokens=1,
        global_pool="avg",
        fc_norm=True,
    ),
    "vit_small_patch16_dinov3": dict(  # rotate-half pairs, reordered to adjacent ones
        rope={"name": "dinov3"},
        pos_embed="none",
        init_values=1e-5,
        reg_tokens=4,
        qkv_bias=False,
        global_pool="avg",
        fc_norm=False,
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-5),
    ),
}


def timm_rope_vit(arch: str, seed: int = 0):
    """timm's own model at tiny dims, every tensor moved off its init (layer scales of 1e-5 would hide attention)."""
    torch.manual_seed(seed)
    extra = {"ref_feat_shape": (4, 4)} if "reg1" in arch else {}
    model = timm.create_model(arch, **TINY, **extra).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def zoo_vit(arch: str, attention: str = "softmax", **overrides):
    opts = {**CASES[arch], **overrides}
    spec = {"name": attention, "rope": opts.pop("rope")}
    return vitzoo.create_model("vit_small", attention=spec, **TINY, **opts).eval()


@pytest.mark.parametrize("arch", list(CASES))
def test_a_saved_rope_vit_gives_timms_logits_with_softmax_and_the_same_rope(arch, tmp_path):
    teacher = timm_rope_vit(arch)
    path = tmp_path / "rope_vit.safetensors"
    save_file(teacher.state_dict(), str(path))
    model = zoo_vit(arch)
    report = initialise_from(model, path)
    assert report.new == [] and report.unused == [] and "RoPE settings are not in a state dict" in str(report)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), teacher(x), atol=1e-5)
        x = torch.randn(2, 3, 48, 40)  # another grid: both extrapolate (or rescale to ref_grid) the same way
        teacher.set_input_size(img_size=(48, 40))
        assert torch.allclose(model(x), teacher(x), atol=1e-5)


@pytest.fixture
def timm_source(monkeypatch):
    """``timm:<arch>.<tag>`` without a download: timm.create_model gives the tiny teacher (meta or loaded)."""
    create = timm.create_model

    def tiny(name, pretrained=False, **kwargs):
        if "." not in name:  # vitzoo's own builds
            return create(name, pretrained=pretrained, **kwargs)
        arch = name.split(".")[0]
        model = create(arch, **TINY, **({"ref_feat_shape": (4, 4)} if "reg1" in arch else {}))
        if pretrained:
            model.load_state_dict(timm_rope_vit(arch).state_dict())
        return model.eval()

    monkeypatch.setattr(pretrained_sources.timm, "create_model", tiny)


def test_dinov3_from_timm_records_its_rotate_half_layout(timm_source):
    arch = "vit_small_patch16_dinov3"
    model = zoo_vit(arch)
    report = initialise_from(model, f"timm:{arch}.lvd1689m")
    assert "rotate-half" not in str(report)  # recorded by the source, not assumed
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), timm_rope_vit(arch)(x), atol=1e-5)
    with pytest.raises(ValueError, match=r"rope=\{'name': 'dinov3', 'base': 100.0.*'normalize': 'separate'\}"):
        initialise_from(zoo_vit(arch, rope={"name": "dinov3", "normalize": "max"}), f"timm:{arch}.lvd1689m")


def test_a_timm_rope_vit_is_checked_against_its_rope_settings(timm_source):
    arch = "vit_small_patch16_rope_224"
    model = zoo_vit(arch)
    report = initialise_from(model, f"timm:{arch}.naver_in1k")
    assert "RoPE settings" not in str(report)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), timm_rope_vit(arch)(x), atol=1e-5)
    with pytest.raises(ValueError, match=r"the checkpoint's ViT has rope=\{'name': 'axial', 'base': 100.0") as err:
        initialise_from(zoo_vit(arch, rope={"name": "axial", "indexing": "xy"}), f"timm:{arch}.naver_in1k")
    assert "\n" not in str(err.value) and "'base': 10000.0" in str(err.value)
    with pytest.raises(ValueError, match="rope=None"):
        initialise_from(
            vitzoo.create_model("vit_small", **TINY, pos_embed="none", init_values=1e-5), f"timm:{arch}.naver_in1k"
        )


@pytest.mark.parametrize("attention", ["linear", "mlla", "window"])
def test_a_rope_vit_loads_into_other_mechanisms_with_the_same_rope(attention, tmp_path):
    arch = "vit_small_patch16_rope_mixed_224"
    teacher = timm_rope_vit(arch)
    save_file(teacher.state_dict(), str(tmp_path / "w.safetensors"))
    model = zoo_vit(arch, attention)
    initialise_from(model, tmp_path / "w.safetensors")
    for i, block in enumerate(model.blocks):
        assert torch.equal(block.attn.rope.freqs, teacher.rope.freqs[:, i])
        assert torch.equal(block.ls1.gamma, teacher.blocks[i].gamma_1)


def test_what_does_not_map_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="SwiGLU|GluMlp") as err:
        initialise_from(zoo_vit("vit_small_patch16_rope_224"), "timm:eva02_tiny_patch14_224.mim_in22k")
    assert "do not map onto vitzoo's ViT" in str(err.value) and "\n" not in str(err.value)
    save_file(timm_rope_vit("vit_small_patch16_rope_mixed_224").state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(ValueError, match=r"rope=\{'name': 'mixed'\}, block 0 of the model rope=\{'name': 'axial'"):
        initialise_from(zoo_vit("vit_small_patch16_rope_224"), tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match="pos_embed='none'"):
        initialise_from(zoo_vit("vit_small_patch16_rope_mixed_224", pos_embed="learn"), tmp_path / "w.safetensors")


def test_a_gated_rope_vit_maps_its_gate_onto_the_channel_gate(tmp_path):
    """timm's gated attention (attn.gate, a sigmoid after the scale-norm) is vitzoo's ``gate: channel``."""
    arch = "vit_small_patch16_rope_224"
    teacher = timm_rope_vit(arch)
    torch.manual_seed(5)
    for block in teacher.blocks:
        block.attn.gate = torch.nn.Linear(32, 32, bias=True)
    save_file(teacher.state_dict(), str(tmp_path / "gated.safetensors"))
    model = vitzoo.create_model(
        "vit_small",
        attention={"name": "softmax", "rope": NAVER_AXIAL, "gate": "channel"},
        **TINY,
        pos_embed="none",
        init_values=1e-5,
    ).eval()
    report = initialise_from(model, tmp_path / "gated.safetensors")
    assert report.new == [] and report.unused == []
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), teacher(x), atol=1e-5)
