"""Hybrid stacks: a mechanism per block in create_model (list and short form), in both backbones, through Hydra,
exports and attention transfer (only the converted blocks are taught)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

import vitzoo
from conftest import QUIET_TRAINER, compose_config
from vitzoo.attention import LinearAttention, LionAttention, RalaAttention, SoftmaxAttention, ZooAttention
from vitzoo.attention.stack import block_specs, describe
from vitzoo.export import export_model, load_exported
from vitzoo.training import build_classifier
from vitzoo.training.transfer import attention_layers

VIT = dict(img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, num_classes=3)


def vit(attention, seed=0, **kwargs):
    torch.manual_seed(seed)
    return vitzoo.create_model("vit_tiny", attention=attention, **VIT, **kwargs).eval()


def kinds(model):
    return [type(m) for m in model.modules() if isinstance(m, ZooAttention)]


def test_the_list_and_the_short_form_build_the_same_stack():
    listed = vit(["rala", "rala", "rala", {"name": "softmax", "logit_noise": 0.1}])
    short = vit({":-1": "rala", "-1:": {"name": "softmax", "logit_noise": 0.1}})
    assert kinds(listed) == kinds(short) == [RalaAttention] * 3 + [SoftmaxAttention]
    assert [b.attn.block_index for b in listed.blocks] == [0, 1, 2, 3]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(listed(x), short(x), rtol=0, atol=0)


def test_a_stack_of_one_mechanism_is_that_mechanism():
    """Same seed, same construction order: a list repeating one spec computes what the spec alone does."""
    x = torch.randn(2, 3, 48, 32)
    with torch.no_grad():
        torch.testing.assert_close(vit(["linear"] * 4)(x), vit("linear")(x), rtol=0, atol=0)


def test_shared_options_reach_every_block_and_specs_keep_their_own():
    model = vit({":2": "linear", "2:": {"name": "lion", "decay": "selective", "logit_noise": 0.3}, "logit_noise": 0.2})
    assert kinds(model) == [LinearAttention] * 2 + [LionAttention] * 2
    assert [b.attn.logit_noise for b in model.blocks] == [0.2, 0.2, 0.3, 0.3]


def test_slices_follow_the_depth():
    """``-3:`` is the last three blocks at any depth, and may leave ``:-3`` empty."""
    form = {":-3": "rala", "-3:": "softmax"}
    assert [describe(s) for s in block_specs(form, 5)] == ["rala"] * 2 + ["softmax"] * 3
    assert block_specs(form, 2) == ["softmax"] * 2
    assert describe(form) == "rala :-3 + softmax -3:" and describe(["rala"] * 2 + ["softmax"]) == "rala x2 + softmax x1"


@pytest.mark.parametrize(
    "attention, fix",
    [
        (["linear"] * 3, "lists 3 specs for 4 blocks"),
        ({":2": "linear"}, r"leave blocks \[2, 3\] without a mechanism"),
        ({":3": "linear", "2:": "softmax"}, "block 2 is in two ranges"),
        ({"7": "linear", ":": "softmax"}, "block 7 lies outside blocks 0-3"),
        ({"heads": "split"}, "neither a 'name' nor block ranges"),
        ({":2": "linear", "2:": "softmaxx"}, "unknown attention 'softmaxx'"),
        ({":2": "linear", "2:": "softmax", "0-5": "rala"}, r"has no option\(s\) \[.0-5.\]"),
    ],
)
def test_a_bad_stack_is_one_line_naming_the_fix(attention, fix):
    with pytest.raises(ValueError, match=fix) as err:
        vit(attention)
    assert "\n" not in str(err.value)


def test_the_non_local_resnet_takes_a_stack_over_its_non_local_blocks():
    torch.manual_seed(0)
    model = vitzoo.create_model(
        "nonlocal_resnet18_cifar",
        attention=["softmax", {"name": "lion", "decay": "fixed"}],
        channels=(8, 16, 16, 16),
        stem_width=8,
        num_classes=3,
        nonlocal_per_stage=1,
    )
    assert kinds(model) == [SoftmaxAttention, LionAttention]
    out = model(torch.randn(2, 3, 48, 48))
    out.square().mean().backward()
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="lists 3 specs for 2 blocks"):
        vitzoo.create_model(
            "nonlocal_resnet18_cifar", attention=["softmax"] * 3, channels=(8, 16, 16, 16), stem_width=8
        )


@pytest.mark.parametrize("attention", [["linear", "pola", "lion", "softmax"], {":-1": "mlla", "-1:": "softmax"}])
def test_a_reloaded_export_rebuilds_the_same_stack(attention, tmp_path):
    model = vit(attention)
    export_model(model, tmp_path / "export")
    again = load_exported(tmp_path / "export").eval()
    assert kinds(again) == kinds(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x), rtol=0, atol=0)


def test_hydra_takes_the_short_form_preset_and_a_list(tmp_path):
    cfg = compose_config(tmp_path, ["debug=tiny_vit", "model=vit_rala_softmax", "model.kwargs.depth=4"])
    module = build_classifier(cfg, instantiate(cfg.data))
    assert kinds(module.model) == [RalaAttention] + [SoftmaxAttention] * 3
    listed = compose_config(
        tmp_path,
        [
            "debug=tiny_vit",
            "model.kwargs.depth=2",
            "model.attention=null",
            "model.attention=[linear,{name: rala, kernel_size: 3}]",
        ],
    )
    assert OmegaConf.to_container(listed.model.attention) == ["linear", {"name": "rala", "kernel_size": 3}]
    module = build_classifier(listed, instantiate(listed.data))
    assert kinds(module.model) == [LinearAttention, RalaAttention]


def _transfer_module(tmp_path, attention):
    from test_transfer import _teacher_file

    cfg = compose_config(
        tmp_path,
        [
            "debug=tiny_vit",
            "model.kwargs.depth=2",
            "experiment=transfer",
            "module.optim.lr=1e-2",
            "module.optim.warmup_epochs=0",
            f"model.init_from={_teacher_file(tmp_path)}",
            "model.attention=null",
            f"model.attention={attention}",
        ],
    )
    datamodule = instantiate(cfg.data)
    return build_classifier(cfg, datamodule), datamodule


def test_transfer_teaches_only_the_converted_blocks(tmp_path):
    module, datamodule = _transfer_module(tmp_path, "[linear,softmax]")
    datamodule.setup("fit")
    images = next(iter(datamodule.val_dataloader()))[0]
    assert list(module.transfer_losses(images)) == ["block0"]
    student, teacher = attention_layers(module.model), attention_layers(module.teacher)
    assert not any(p.requires_grad for p in student[1].parameters())
    assert any(p.requires_grad for p in student[0].parameters())
    before = {n: t.clone() for n, t in module.model.blocks[1].state_dict().items()}
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, **QUIET_TRAINER)
    trainer.fit(module, datamodule=datamodule)
    after = module.model.blocks[1].state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)  # the softmax block stays the teacher's
    torch.testing.assert_close(student[1].in_proj.proj.weight, teacher[1].in_proj.proj.weight, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("block", ["timm", "mlla"])
def test_both_onnx_exporters_carry_a_stack_and_the_mlla_block(block, dynamo):
    """A stack of the recent mechanisms, in timm's block and in MLLA's, in onnxruntime at another batch size."""
    from deploy_checks import assert_logits, onnx_logits

    model = vit(["mlla", {"name": "lion", "decay": "selective", "chunk": 8}, "pola", "softmax"], block=block)
    x, other = torch.randn(2, 3, 32, 32), torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert_logits(onnx_logits(model, x, dynamo, run_on=other), model(other))
