"""init_from: a timm VisionTransformer's weights into any mechanism; timm's logits back with softmax; clear errors."""

from __future__ import annotations

import logging

import pytest
import timm
import torch
from huggingface_hub.errors import LocalEntryNotFoundError
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

import vitzoo
from conftest import compose_config
from vitzoo.export import export_model
from vitzoo.models import hub_probe, initialise_from
from vitzoo.training import build_classifier, load_classifier, train

SHAPE = dict(embed_dim=64, depth=2, num_heads=2, patch_size=8)
VARIANTS = [
    {},
    {"reg_tokens": 2},
    {"class_token": False, "global_pool": "avg"},
    {"no_embed_class": True, "reg_tokens": 1, "init_values": 1e-5, "qk_norm": True},
]


def _timm_vit(img_size=32, seed=0, **kwargs) -> VisionTransformer:
    """A timm ViT with every tensor distinct (norms and tokens moved off their constant init)."""
    torch.manual_seed(seed)
    model = VisionTransformer(img_size=img_size, num_classes=10, **{**SHAPE, **kwargs}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _zoo_vit(attention="softmax", img_size=32, seed=1, **kwargs):
    torch.manual_seed(seed)
    return vitzoo.create_model(
        "vit_tiny", attention=attention, img_size=img_size, **{**SHAPE, "num_classes": 10, **kwargs}
    ).eval()


def _save(model, path):
    if path.suffix == ".safetensors":
        save_file(model.state_dict(), str(path))
    else:
        torch.save(model.state_dict(), path)
    return path


def _timm_at(source: VisionTransformer, img_size, **kwargs) -> VisionTransformer:
    """timm's own way to another size: its checkpoint filter resamples the position embedding."""
    model = VisionTransformer(img_size=img_size, num_classes=10, **{**SHAPE, **kwargs}).eval()
    model.load_state_dict(checkpoint_filter_fn(source.state_dict(), model))
    return model


@pytest.mark.parametrize("variant", VARIANTS, ids=["plain", "reg2", "avg-no-cls", "no-embed-cls-ls-qknorm"])
@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_softmax_gives_timms_logits_at_the_checkpoint_size_and_another(variant, suffix, tmp_path):
    teacher = _timm_vit(**variant)
    path = _save(teacher, tmp_path / f"vit{suffix}")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        same = vitzoo.create_model(
            "vit_tiny", attention="softmax", img_size=32, num_classes=10, init_from=path, **SHAPE, **variant
        ).eval()
        torch.testing.assert_close(same(x), teacher(x), atol=1e-5, rtol=0)
        other = (32, 48)  # a 4x6 grid from the checkpoint's 4x4
        resized = _zoo_vit(img_size=other, init_from=path, **variant)
        x = torch.randn(2, 3, *other)
        torch.testing.assert_close(resized(x), _timm_at(teacher, other, **variant)(x), atol=1e-5, rtol=0)


def test_projected_heads_start_as_the_checkpoints_q_k_v(tmp_path):
    teacher = _timm_vit()
    path = _save(teacher, tmp_path / "vit.safetensors")
    model = _zoo_vit({"name": "softmax", "heads": "projected"}, init_from=path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), teacher(x), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"projected heads reproduce .* 2 x 16 = 32: leave head_dim unset") as err:
        _zoo_vit({"name": "softmax", "heads": "projected", "head_dim": 16}, init_from=path)
    assert "\n" not in str(err.value)


def _timm_qkv(block, tokens):
    B, N, C = tokens.shape
    attn = block.attn
    qkv = attn.qkv(tokens).reshape(B, N, 3, attn.num_heads, C // attn.num_heads).permute(2, 0, 3, 1, 4)
    return qkv.unbind(0)


@pytest.mark.parametrize(
    "attention, own",
    [
        ("linear", []),
        ("performer", ["blocks.*.attn.phi.{seed,step,weight}"]),
        (
            "focused_linear",
            ["blocks.*.attn.phi.scale", "blocks.*.attn.pos.{weight,layout}", "blocks.*.attn.dwc.{weight,bias}"],
        ),
        ("agent", ["blocks.*.attn.dwc.{weight,bias}", "blocks.*.attn.bias.{an,na,ah,aw,ha,wa,ac,ca,layout}"]),
        ("linformer", ["blocks.*.attn.e.{weight,layout}", "blocks.*.attn.f.{weight,layout}"]),
        ("synth_random", ["blocks.*.attn.synth.{weight,layout}"]),
    ],
)
def test_a_mechanism_gets_the_shared_tensors_and_keeps_its_own(attention, own, tmp_path, caplog):
    teacher = _timm_vit(reg_tokens=1)
    path = _save(teacher, tmp_path / "vit.safetensors")
    fresh = _zoo_vit(attention, num_classes=7, reg_tokens=1, seed=3)
    caplog.set_level(logging.INFO, logger="vitzoo.models.pretrained")
    model = _zoo_vit(attention, num_classes=7, reg_tokens=1, seed=3, init_from=path)
    lines = [r.getMessage() for r in caplog.records if r.name == "vitzoo.models.pretrained"]
    assert len(lines) == 1 and "\n" not in lines[0]
    line = lines[0]
    new = ", ".join(own + ["head.{weight,bias}"])
    assert f"; new: {new} (the model has 7 classes, the checkpoint 10); unused from the checkpoint: head." in line
    if attention == "synth_random":
        assert line.endswith("blocks.*.attn.qkv (rows q, k)")
    ckpt, mine, before = teacher.state_dict(), model.state_dict(), fresh.state_dict()
    for name, tensor in mine.items():
        if name in ckpt and not name.startswith("head."):
            assert torch.equal(tensor, ckpt[name]), name
        elif ".attn.in_proj." not in name:  # the mechanism's own tensors and the new head: as a fresh build has them
            assert torch.equal(tensor, before[name]), name
    loaded = len([n for n in mine if n in ckpt and not n.startswith("head.")]) + 2 * SHAPE["depth"]
    assert line.startswith(f"init_from={path}: {loaded} tensors loaded;")
    tokens = torch.randn(2, 18, SHAPE["embed_dim"])
    with torch.no_grad():
        for block, ref in zip(model.blocks, teacher.blocks):
            got = dict(zip("qkv", block.attn.project(tokens)))
            for name, want in zip("qkv", _timm_qkv(ref, tokens)):
                if got[name] is not None:
                    torch.testing.assert_close(got[name], want, atol=1e-6, rtol=0)


def test_a_width_depth_or_head_mismatch_is_one_error_naming_both(tmp_path):
    path = _save(_timm_vit(), tmp_path / "vit.safetensors")
    with pytest.raises(
        ValueError,
        match=r"checkpoint's ViT has embed_dim=64, depth=2, the model embed_dim=32, "
        r"depth=3; .*\+\+model.kwargs.embed_dim=64 \+\+model.kwargs.depth=2",
    ) as err:
        _zoo_vit(embed_dim=32, depth=3, init_from=path)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"reg_tokens=0, the model reg_tokens=2"):
        _zoo_vit(reg_tokens=2, init_from=path)
    normed = _save(_timm_vit(qk_norm=True), tmp_path / "qknorm.pth")  # q_norm's width records the heads
    with pytest.raises(ValueError, match=r"has num_heads=2, the model num_heads=4"):
        _zoo_vit(num_heads=4, qk_norm=True, init_from=normed)
    export = export_model(_zoo_vit(), tmp_path / "export")  # an export's config records them too
    with pytest.raises(ValueError, match=r"has num_heads=2, the model num_heads=4") as err:
        _zoo_vit("linear", num_heads=4, init_from=export)
    assert "\n" not in str(err.value)


def test_a_checkpoint_that_is_not_a_vit_is_one_error(tmp_path):
    resnet = vitzoo.create_model("nonlocal_resnet18_cifar", channels=[16, 32, 64, 128], stem_width=16)
    path = _save(resnet, tmp_path / "resnet.pth")
    with pytest.raises(
        ValueError,
        match=r"is not a timm VisionTransformer state dict \(it has no "
        r"patch_embed.proj.weight.*; its first keys: conv1",
    ) as err:
        _zoo_vit(init_from=path)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"timm:resnet18.a1_in1k' is a ResNet, not a ViT"):
        _zoo_vit(init_from="timm:resnet18.a1_in1k")
    with pytest.raises(ValueError, match=r"holds LinearAttention weights; init_from takes a softmax ViT"):
        _zoo_vit(init_from=export_model(_zoo_vit("linear"), tmp_path / "linear"))
    with pytest.raises(ValueError, match=r"loads a ViT's weights; NonLocalResNet is not a vitzoo ViT"):
        initialise_from(resnet, _save(_timm_vit(), tmp_path / "vit.pth"))
    with pytest.raises(ValueError, match=r"not a feature wrapper \(features_only=True\)"):
        _zoo_vit(features_only=True, init_from=tmp_path / "vit.pth")
    with pytest.raises(FileNotFoundError, match=r"does not exist; give timm:<model>.<tag>, a .safetensors"):
        _zoo_vit(init_from=tmp_path / "missing.safetensors")
    (tmp_path / "last.ckpt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"is a training checkpoint; export it first"):
        _zoo_vit(init_from=tmp_path / "last.ckpt")
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"is not a readable state dict"):
        _zoo_vit(init_from=tmp_path / "junk.bin")


@pytest.mark.parametrize("heads", ["split", "projected"])
def test_an_export_folder_round_trips(heads, tmp_path):
    source = _zoo_vit({"name": "softmax", "heads": heads}, reg_tokens=2, seed=5)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    export = export_model(source, tmp_path / "export")
    model = _zoo_vit(reg_tokens=2, init_from=export)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), atol=1e-5, rtol=0)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """timm's hub download from a hub that answers (the probe of vitzoo.models.hub_probe says so), from a local file
    of random ViT-Ti/16 weights (or failing as the hub library does for a file it cannot find)."""
    monkeypatch.setattr(hub_probe, "hub_reachable", lambda endpoint: True)
    torch.manual_seed(0)
    weights = tmp_path / "model.safetensors"
    save_file(timm.create_model("vit_tiny_patch16_224").state_dict(), str(weights))

    def download(*args, **kwargs):
        if hub.offline:
            raise LocalEntryNotFoundError(
                "An error happened while trying to locate the file on the Hub and we "
                "cannot find the requested files in the local cache.\nCheck your connection"
            )
        return str(weights)

    hub.offline = False
    monkeypatch.setattr(timm.models._hub, "hf_hub_download", download)
    return hub


@pytest.mark.slow
def test_the_timm_form_loads_through_timms_download_and_offline_is_one_line(hub):
    name = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    model = vitzoo.create_model("vit_tiny", img_size=32, num_classes=1000, init_from=f"timm:{name}").eval()
    reference = timm.create_model(name, pretrained=True, img_size=32).eval()  # timm resamples 14x14 -> 2x2 itself
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=0)
    hub.offline = True
    with pytest.raises(
        ValueError,
        match=rf"init_from='timm:{name}': the weights could not be downloaded \(An error "
        r".*\); offline, pass a local file.*init_from=/path/to/weights.safetensors$",
    ) as err:
        vitzoo.create_model("vit_tiny", img_size=32, init_from=f"timm:{name}")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"the checkpoint's ViT has depth=12, the model depth=3"):
        vitzoo.create_model("vit_tiny", img_size=32, depth=3, init_from=f"timm:{name}")  # checked before downloading
    with pytest.raises(ValueError, match=r"Invalid pretrained tag \(nope\).*timm.list_pretrained"):
        vitzoo.create_model("vit_tiny", init_from="timm:vit_tiny_patch16_224.nope")


def _hydra_teacher(tmp_path):
    """A timm ViT with the fast test preset's shape (vit_cifar: patch 4, MLP ratio 2; 16 px, 1 block, 32 wide)."""
    teacher = VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2, mlp_ratio=2.0, num_classes=10
    )
    return teacher, _save(teacher, tmp_path / "teacher.safetensors")


def test_model_init_from_reaches_the_model_in_hydra(tmp_path):
    teacher, path = _hydra_teacher(tmp_path)
    cfg = compose_config(tmp_path, ["debug=tiny_vit", "model=vit_linear", f"model.init_from={path}"])
    from hydra.utils import instantiate

    module = build_classifier(cfg, instantiate(cfg.data))
    mine = module.model.state_dict()
    assert all(torch.equal(mine[name], tensor) for name, tensor in teacher.state_dict().items() if name in mine)
    assert "init_from" not in module.hparams  # a checkpoint rebuilds the network without the source


@pytest.mark.slow
def test_a_resumed_run_takes_its_weights_from_the_checkpoint_not_init_from(tmp_path):
    _, path = _hydra_teacher(tmp_path)
    base = ["debug=tiny_vit", "model=vit_softmax"]
    train(compose_config(tmp_path / "run", [*base, "trainer.max_epochs=1", f"model.init_from={path}"]))
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    broken = _save(
        vitzoo.create_model("nonlocal_resnet18_cifar", channels=[16, 32, 64, 128], stem_width=16),
        tmp_path / "resnet.pth",
    )  # initialise_from would refuse it
    metrics = train(
        compose_config(
            tmp_path / "run", [*base, "trainer.max_epochs=2", f"ckpt_path={last}", f"model.init_from={broken}"]
        )
    )
    assert metrics["epoch"] == 2
    path.unlink()
    model, _ = load_classifier(str(last))  # eval needs only the checkpoint
    assert model.pos_embed.shape == (1, 17, 32)
