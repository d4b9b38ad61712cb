"""experiment=transfer: stage 1 trains only the attention to match the softmax teacher, stage 2 fine-tunes with KL."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

from conftest import QUIET_TRAINER, compose_config
from vitzoo.training import build_classifier, build_run, train
from vitzoo.training.transfer import attention_layers

# debug=tiny_vit with two blocks (vit_cifar: patch 4, MLP ratio 2), so per-layer losses have two rows.
SMALL = ["debug=tiny_vit", "model.kwargs.depth=2"]


def _teacher_file(tmp_path, num_classes=10):
    torch.manual_seed(0)
    teacher = VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=num_classes
    )
    with torch.no_grad():
        for p in teacher.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path / f"teacher{num_classes}.safetensors"
    save_file(teacher.state_dict(), str(path))
    return path


def _config(tmp_path, *overrides, init_from=None):
    source = [f"model.init_from={init_from}"] if init_from else []
    return compose_config(
        tmp_path,
        [*SMALL, "experiment=transfer", "module.optim.lr=1e-2", "module.optim.warmup_epochs=0", *source, *overrides],
    )


def _build(cfg):
    datamodule = instantiate(cfg.data)
    return build_classifier(cfg, datamodule), datamodule


def _may_change(name: str, qk: str) -> bool:
    """Stage 1's rule: the mechanism's own tensors, and with qk=train the q/k maps and norms (not their v rows)."""
    if not name.startswith("model.") or ".attn." not in name:
        return False
    rest = name.split(".attn.", 1)[1]
    if not rest.startswith(("in_proj.", "proj.", "q_norm.", "k_norm.", "norm.")):
        return True
    return qk == "train" and rest.startswith(("in_proj.", "q_norm.", "k_norm."))


def _v_rows(module, state):
    """Every attention layer's v part of its fused input projection (and projected-head matrices)."""
    rows = []
    for i, attn in enumerate(attention_layers(module.model)):
        prefix, v = f"model.blocks.{i}.attn.in_proj.", attn.projections.index("v")
        for name in ("proj.weight", "proj.bias", "head_weight"):
            if prefix + name in state:
                tensor = state[prefix + name]
                width = 1 if name == "head_weight" else tensor.shape[0] // len(attn.projections)
                rows.append(tensor[v * width : (v + 1) * width])
    return rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset, extra, qk",
    [
        ("vit_linear", [], "train"),
        ("vit_linear", ["model.attention.heads=projected"], "train"),
        ("vit_focused_linear", ["transfer.qk=freeze"], "freeze"),
    ],
)
def test_stage_1_lowers_the_transfer_loss_and_changes_only_the_attention(preset, extra, qk, tmp_path):
    cfg = _config(tmp_path, f"model={preset}", *extra, init_from=_teacher_file(tmp_path))
    L.seed_everything(0)
    module, datamodule = _build(cfg)
    datamodule.setup("fit")
    images = next(iter(datamodule.val_dataloader()))[0]
    before = {name: t.clone() for name, t in module.state_dict().items()}
    with torch.no_grad():
        loss_before = sum(module.transfer_losses(images).values())
    trainer = L.Trainer(max_epochs=2, **QUIET_TRAINER)
    trainer.fit(module, datamodule=datamodule)  # 8 steps
    after = module.state_dict()
    with torch.no_grad():
        loss_after = sum(module.transfer_losses(images).values())
    assert loss_after < 0.7 * loss_before
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all(_may_change(name, qk) for name in changed), sorted(changed)
    assert all(torch.equal(a, b) for a, b in zip(_v_rows(module, before), _v_rows(module, after)))
    if qk == "train":
        assert any(".in_proj." in name for name in changed)


class SaveStateAtFitStart(L.Callback):
    """Writes the module's state dict to ``path`` as fitting starts (used through +callbacks.keep)."""

    def __init__(self, path: str):
        self.path = path

    def on_fit_start(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), self.path)


def test_build_run_gives_the_network_a_run_starts_from_with_its_own_random_parameters(tmp_path):
    """What benchmarks/transfer_table.py evaluates as the loaded student is the stage-1 run's first network: Linformer's
    E/F projections start at a random initialisation, which must be the run's (seeded), not another draw."""
    source, start = _teacher_file(tmp_path), tmp_path / "start.pt"
    run = [
        "model=vit_linformer",
        "trainer.max_epochs=1",
        "++trainer.limit_train_batches=1",
        "++trainer.limit_val_batches=1",
        "+callbacks.keep._target_=test_transfer.SaveStateAtFitStart",
        f"+callbacks.keep.path={start}",
    ]
    train(_config(tmp_path / "run", *run, init_from=source))
    started = torch.load(start, weights_only=True)
    own = [name for name in started if name.endswith((".attn.e.weight", ".attn.f.weight"))]
    assert own, sorted(started)  # the mechanism has parameters the teacher does not give

    torch.manual_seed(123)  # whatever ran before in this process
    _, module = build_run(_config(tmp_path / "build", *run, init_from=source))
    assert all(torch.equal(t, started[name]) for name, t in module.state_dict().items())
    unseeded, _ = _build(_config(tmp_path / "other", *run, init_from=source))
    assert not all(torch.equal(unseeded.state_dict()[name], started[name]) for name in own)


def test_a_softmax_student_matches_its_teacher_and_the_row_loss_is_the_teachers_entropy(tmp_path):
    """Student = teacher: every layer's MSE is exactly 0 and the row cross-entropy is H(teacher rows) (float64)."""
    cfg = _config(tmp_path, "model=vit_softmax", "transfer.attention_ce=1.0", init_from=_teacher_file(tmp_path))
    module, _ = _build(cfg)
    module.eval()
    images = torch.randn(2, 3, 16, 16)
    captured = []
    hooks = [
        layer.register_forward_hook(lambda m, args, out: captured.append(args[0]))
        for layer in attention_layers(module.teacher)
    ]
    with torch.no_grad():
        losses = module.transfer_losses(images)
    for hook in hooks:
        hook.remove()
    expected = []
    for x, layer in zip(captured, attention_layers(module.teacher)):
        B, N, C = x.shape
        qkv = x.double() @ layer.in_proj.proj.weight.double().T + layer.in_proj.proj.bias.double()
        q, k, _ = qkv.reshape(B, N, 3, layer.num_heads, layer.head_dim).permute(2, 0, 3, 1, 4)
        probs = torch.softmax(q @ k.transpose(-2, -1) * layer.head_dim**-0.5, dim=-1)
        expected.append(float(-(probs * probs.log()).sum(-1).mean()))
    assert list(losses) == ["block0", "block1"]
    for loss, entropy in zip(losses.values(), expected):
        assert math.isclose(float(loss), entropy, rel_tol=1e-5)  # MSE 0 + the cross-entropy of a row with itself


@pytest.mark.slow
def test_stage_1_resumes_without_its_source_and_stage_2_fine_tunes_with_teacher_logits(tmp_path):
    source = _teacher_file(tmp_path)
    first = tmp_path / "stage1"
    metrics = train(_config(first, "model=vit_linear", "trainer.max_epochs=1", init_from=source))
    assert {"train/transfer/block0", "train/transfer/block1", "val/transfer_loss", "val/acc1"} <= set(metrics)
    assert list(first.glob("tensorboard/**/events.out.tfevents.*"))
    last = first / "checkpoints" / "last.ckpt"
    moved = source.rename(tmp_path / "elsewhere.safetensors")  # a resumed run reads the teacher from its checkpoint
    metrics = train(_config(first, "model=vit_linear", "trainer.max_epochs=2", f"ckpt_path={last}", init_from=source))
    assert metrics["epoch"] == 2
    with pytest.raises(ValueError, match="the checkpoint is of transfer stage 1, this run stage 2"):
        train(_config(first, "model=vit_linear", "trainer.max_epochs=3", f"ckpt_path={last}", "transfer.stage=2"))

    stage2 = [
        "model=vit_linear",
        "transfer.stage=2",
        f"transfer.student={last}",
        "transfer.distill=1.0",
        "transfer.temperature=2.0",
        "trainer.max_epochs=1",
    ]
    module, _ = _build(_config(tmp_path / "stage2", *stage2))
    saved = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    assert all(torch.equal(t, saved[name]) for name, t in module.state_dict().items() if name in saved)
    metrics = train(_config(tmp_path / "stage2", *stage2))
    assert math.isfinite(metrics["train/distill"]) and metrics["train/distill"] > 0
    assert (tmp_path / "stage2" / "export" / "model.safetensors").is_file()
    assert moved.is_file()


def test_bad_transfer_options_are_one_line_errors(tmp_path):
    source = _teacher_file(tmp_path)
    cases = [
        (["model=vit_linear", "transfer.stage=3"], source, r"transfer.stage=3; give 1 .* or 2"),
        (["model=vit_linear", "transfer.qk=freeze"], source, r"LinearAttention has no parameters of its own"),
        (["model=vit_linear"], None, r"stage 1 starts from a pretrained softmax ViT: pass model.init_from="),
        (
            ["model=vit_linear", "transfer.stage=2", "transfer.distill=1.0"],
            _teacher_file(tmp_path, 5),
            r"transfer.distill needs the teacher's logits .*the model has 10 classes, the checkpoint 5",
        ),
        (["model=vit_linear", "+transfer.bogus=1"], source, r"transfer has no option\(s\) \['bogus'\]"),
    ]
    for overrides, init_from, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            _build(_config(tmp_path, *overrides, init_from=init_from))
        assert "\n" not in str(err.value)
