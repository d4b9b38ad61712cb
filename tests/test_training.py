"""The Lightning module, schedule, checkpoints, resume, evaluation and DDP, driven through configs/."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Dict

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from lightning.pytorch.callbacks import RichProgressBar

from conftest import SyncOps, compose_config, run_python
from vitzoo.data import DigitsDataModule
from vitzoo.robustness.run import evaluate_checkpoints
from vitzoo.training import (
    ImageClassifier,
    ThrottledProgressBar,
    build_classifier,
    build_optimizer,
    evaluate,
    load_classifier,
    read_checkpoint,
    train,
    warmup_cosine,
)


def test_warmup_cosine_shape():
    total, warmup, floor = 100, 10, 0.05
    f = [warmup_cosine(s, total, warmup, floor) for s in range(total + 1)]
    assert f[0] == pytest.approx(1 / 11) and f[warmup] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(f[:warmup], f[1 : warmup + 1]))  # rises during warmup
    assert all(a >= b for a, b in zip(f[warmup:], f[warmup + 1 :]))  # then only falls
    assert f[total] == pytest.approx(floor)
    mid = warmup + (total - warmup) // 2
    assert f[mid] == pytest.approx(floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_no_weight_decay_on_biases_norms_and_tokens():
    module = ImageClassifier(
        "vit_cifar", "softmax", num_classes=10, img_size=16, model_kwargs=dict(depth=1, embed_dim=32, num_heads=2)
    )
    optimizer = build_optimizer(module.model, lr=1e-3, weight_decay=0.05)
    names = {id(p): n for n, p in module.model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            no_decay = p.ndim <= 1 or names[id(p)] in ("pos_embed", "cls_token")
            assert group["weight_decay"] == (0.0 if no_decay else 0.05), names[id(p)]


def test_fused_adamw_steps_like_the_default_one():
    """module.optim.fused=true is a fast path: the same weights as torch's default AdamW after a few steps."""
    results = []
    for fused in (None, True):
        torch.manual_seed(0)
        module = ImageClassifier(
            "vit_cifar", "softmax", num_classes=10, img_size=16, model_kwargs=dict(depth=1, embed_dim=32, num_heads=2)
        )
        optimizer = build_optimizer(module.model, lr=1e-2, weight_decay=0.05, fused=fused)
        assert bool(optimizer.defaults.get("fused")) == bool(fused)
        x, y = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.arange(8) % 10
        for _ in range(3):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(module.model(x), y).backward()
            optimizer.step()
        results.append(torch.cat([p.detach().flatten() for p in module.model.parameters()]))
    assert not torch.equal(
        results[0],
        torch.cat(
            [
                p.detach().flatten()
                for p in ImageClassifier(
                    "vit_cifar",
                    "softmax",
                    num_classes=10,
                    img_size=16,
                    model_kwargs=dict(depth=1, embed_dim=32, num_heads=2),
                ).model.parameters()
            ]
        ),
    )
    diff = (results[1] - results[0]).abs()
    # Float rounding differs between the kernels; Adam divides by sqrt(v) + eps, which magnifies it only where
    # a gradient is near eps (0.3% of the weights here). A wrong formula would move every weight by ~lr.
    assert (diff <= 1e-6).float().mean() > 0.99 and diff.max() < 0.05 * 1e-2, (diff.max(), (diff > 1e-6).sum())


def test_unknown_recipe_option_names_the_valid_ones():
    with pytest.raises(ValueError, match="module.optim has no option.*'lrate'.*valid options"):
        ImageClassifier("vit_cifar", "softmax", num_classes=10, img_size=16, optim=dict(lrate=1.0))


@pytest.mark.slow
def test_digits_training_learns_and_checkpoint_rebuilds_the_model(tmp_path):
    """A real (small) run: accuracy rises far above chance; the checkpoint alone rebuilds the net."""
    cfg = compose_config(tmp_path, ["model=vit_softmax", "debug=digits"])
    metrics = train(cfg)
    assert metrics["val/acc1"] > 0.6, metrics  # 10 classes: chance is 0.1
    assert metrics["val/acc5"] >= metrics["val/acc1"]
    assert metrics["train/loss_epoch"] < 1.6
    # Checkpoints and TensorBoard files are where the README says.
    ckpts = tmp_path / "checkpoints"
    assert (ckpts / "last.ckpt").is_file() and Path(metrics["best_ckpt"]).parent == ckpts
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "metrics.json").read_text())["val/acc1"] == pytest.approx(metrics["val/acc1"])
    # Per-layer attention entropy was logged each validation epoch, as a fraction of log n.
    entropy = {k: v for k, v in metrics.items() if k.startswith("entropy/")}
    assert sorted(entropy) == ["entropy/blocks.0.attn", "entropy/blocks.1.attn"]
    assert all(0.0 < v <= 1.0 for v in entropy.values())
    # ... and once before training: near-uniform at init, sharper after learning.
    initial = {k: v for k, v in metrics.items() if k.startswith("entropy_init/")}
    assert sorted(initial) == ["entropy_init/blocks.0.attn", "entropy_init/blocks.1.attn"]
    assert all(v > 0.9 for v in initial.values()), initial
    assert sum(entropy.values()) < sum(initial.values())

    checkpoint = read_checkpoint(ckpts / "last.ckpt")  # weights_only=True
    saved = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("AttentionEntropy"))
    assert saved["initial"] == {k.split("/", 1)[1]: v for k, v in initial.items()}
    hp = checkpoint["hyper_parameters"]
    assert hp["arch"] == "vit_cifar" and hp["attention"]["name"] == "softmax" and hp["num_classes"] == 10
    assert hp["img_size"] == 16 and hp["model_kwargs"]["depth"] == 2 and len(hp["mean"]) == len(hp["std"]) == 3
    model, _ = load_classifier(ckpts / "last.ckpt")
    dm = DigitsDataModule(img_size=hp["img_size"], mean=hp["mean"], std=hp["std"])
    dm.setup("validate")
    result = evaluate(model, dm.val_dataloader())
    assert result["num_images"] == 360
    assert result["acc1"] == pytest.approx(metrics["val/acc1"], abs=1e-6)  # last.ckpt = last validated weights
    assert result["loss"] == pytest.approx(metrics["val/loss"], rel=1e-4)

    eval_cfg = compose_config(tmp_path / "eval", [f"ckpt_path={ckpts / 'last.ckpt'}", "robustness=clean"], name="eval")
    evaluate_checkpoints(eval_cfg)
    written = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert written["acc1"] == pytest.approx(result["acc1"]) and written["arch"] == "vit_cifar"


def _scalars(run: Path) -> Dict[str, Dict[int, float]]:
    """Every scalar a run wrote to TensorBoard: {tag: {step: value}}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    series: Dict[str, Dict[int, float]] = {}
    for events in sorted(run.glob("tensorboard/**/events.*")):
        reader = EventAccumulator(str(events))
        reader.Reload()
        for tag in reader.Tags()["scalars"]:
            series.setdefault(tag, {}).update({e.step: e.value for e in reader.Scalars(tag)})
    return series


def _full_and_crashed_at_step_11(tmp_path, base):
    """The 16 steps of ``base`` uninterrupted (its metrics), and the same run stopped by a crash after step 11:
    its last.ckpt and that checkpoint read."""
    full = train(compose_config(tmp_path / "full", base))
    assert full["global_step"] == 16
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(
            compose_config(
                tmp_path / "crash",
                [*base, "+callbacks.crash._target_=conftest.CrashAtStep", "+callbacks.crash.step=11"],
            )
        )
    last = tmp_path / "crash" / "checkpoints" / "last.ckpt"
    return full, last, read_checkpoint(last)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["mid-epoch", "epoch boundary"])
def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path, stop):
    """Crash after step 11 of 16 (epoch 1, batch 3), resume from last.ckpt: written mid-epoch at the crash, or
    (no step checkpoint) at the end of epoch 0. Augmentation, drop-path and (at the boundary) mixup draw random
    numbers; the resumed run must log and end with the very numbers of the run that never stopped."""
    base = ["debug=tiny_vit", "trainer.max_epochs=2", "data.num_train=128", "model.kwargs.drop_path_rate=0.2"]
    if stop == "epoch boundary":
        base += ["callbacks.step_checkpoint=null", "module.mixup.mixup_alpha=0.4"]
    full, last, crashed = _full_and_crashed_at_step_11(tmp_path, base)
    assert crashed["global_step"] == (11 if stop == "mid-epoch" else 8)
    assert crashed["train_loader"] == (
        {"epoch": 1, "batches_taken": 3} if stop == "mid-epoch" else {"epoch": 0, "batches_taken": 8}
    )

    resumed = train(compose_config(tmp_path / "resumed", [*base, f"ckpt_path={last}"]))
    same = {key: value for key, value in full.items() if key.startswith(("train/", "val/"))}
    assert {key: resumed[key] for key in same} == same
    reference, logged = _scalars(tmp_path / "full"), _scalars(tmp_path / "resumed")
    for tag, values in logged.items():
        if tag.startswith(("train/", "val/")):
            assert values == {step: reference[tag][step] for step in values}, tag
    assert min(logged["train/loss_step"]) == crashed["global_step"]  # it went on from the checkpoint's step
    final, expected = (read_checkpoint(tmp_path / run / "checkpoints" / "last.ckpt") for run in ("resumed", "full"))
    assert all(torch.equal(final["state_dict"][k], v) for k, v in expected["state_dict"].items())


def test_resume_after_a_mid_epoch_crash_finishes_like_an_uninterrupted_run(tmp_path):
    base = ["debug=tiny_vit", "trainer.max_epochs=2", "data.num_train=128"]  # 8 steps per epoch
    full, last, crashed = _full_and_crashed_at_step_11(tmp_path, base)  # last.ckpt: save_on_exception, mid epoch 2
    assert crashed["global_step"] == 11 and crashed["epoch"] == 1
    assert crashed["lr_schedulers"][0]["last_epoch"] == 11

    # Another attention has weights of the same shapes: resuming with it must stop, not train it silently.
    (tmp_path / "crash" / ".hydra").mkdir()
    (tmp_path / "crash" / ".hydra" / "overrides.yaml").write_text("- model=vit_linear\n- data=synthetic\n")
    with pytest.raises(
        ValueError,
        match=r"was trained with attention=.*'linear'.*this run: .*'softmax'.*"
        r"started with 'model=vit_linear data=synthetic'",
    ):
        train(compose_config(tmp_path / "other", [*base, "model=vit_softmax", f"ckpt_path={last}"]))

    resumed = train(compose_config(tmp_path / "resumed", [*base, f"ckpt_path={last}"]))
    assert resumed["global_step"] == full["global_step"] and resumed["epoch"] == full["epoch"]
    final, reference = (read_checkpoint(tmp_path / run / "checkpoints" / "last.ckpt") for run in ("resumed", "full"))
    steps = [{int(s["step"]) for s in c["optimizer_states"][0]["state"].values()} for c in (final, reference)]
    assert steps == [{16}, {16}]
    # The scheduler resumed at step 11 too: it ends at the same step and LR as the uninterrupted run.
    sched, sched_ref = final["lr_schedulers"][0], reference["lr_schedulers"][0]
    assert sched["last_epoch"] == sched_ref["last_epoch"] == 16
    assert sched["_last_lr"] == pytest.approx(sched_ref["_last_lr"], rel=1e-12)


def test_last_ckpt_holds_the_final_step_when_the_best_epoch_is_an_earlier_one(tmp_path):
    # monitor=epoch, mode=min: the best checkpoint is epoch 0 whatever the accuracy does; the step
    # checkpoint last writes at step 15 of 16.
    metrics = train(
        compose_config(
            tmp_path,
            [
                "debug=tiny_vit",
                "trainer.max_epochs=2",
                "data.num_train=128",
                "callbacks.model_checkpoint.monitor=epoch",
                "callbacks.model_checkpoint.mode=min",
                "callbacks.step_checkpoint.every_n_train_steps=5",
            ],
        )
    )
    assert Path(metrics["best_ckpt"]).name == "best-epoch000.ckpt"
    assert read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == metrics["global_step"] == 16


def test_mixup_ema_and_bf16_options_train(tmp_path):
    cfg = compose_config(
        tmp_path,
        [
            "debug=tiny_vit",
            "callbacks=ema",
            "callbacks.rich_progress_bar=null",
            "callbacks.ema.decay=0.5",
            "module.mixup.mixup_alpha=0.8",
            "module.mixup.cutmix_alpha=1.0",
            "trainer.precision=bf16-mixed",
            "trainer.max_epochs=1",
        ],
    )
    metrics = train(cfg)
    assert math.isfinite(metrics["train/loss_epoch"]) and "train/acc1" not in metrics  # no hard labels under mixup
    # A checkpoint written during training holds the average as its state_dict, the raw weights beside it.
    checkpoint = read_checkpoint(metrics["best_ckpt"])
    averaged, current = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert averaged.keys() == current.keys()
    assert any(not torch.equal(averaged[k], current[k]) for k in averaged if k.startswith("model."))


def _run(*args):
    return run_python(*args, env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.slow
def test_ddp_two_cpu_processes_log_world_reduced_metrics(tmp_path):
    """trainer=ddp with 2 gloo processes: logged val metrics cover both halves of the val set."""
    run_dir = tmp_path / "ddp"
    data = ["debug=tiny_vit", "data.num_val=64"]
    proc = _run(
        "train.py",
        "trainer=ddp",
        "trainer.devices=2",
        *data,
        "callbacks.attention_entropy=null",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = json.loads((run_dir / "metrics.json").read_text())
    assert logged["global_step"] == 2  # 64 images, batch 16 per process, 2 processes
    model, _ = load_classifier(run_dir / "checkpoints" / "last.ckpt")
    dm = instantiate(compose_config(tmp_path, data).data)
    dm.setup("validate")
    whole = evaluate(model, dm.val_dataloader())
    rank0 = torch.utils.data.Subset(dm.val_dataset, range(0, len(dm.val_dataset), 2))  # DistributedSampler's share
    half = evaluate(model, torch.utils.data.DataLoader(rank0, batch_size=64))
    assert whole["num_images"] == 64
    assert logged["val/loss"] == pytest.approx(whole["loss"], abs=1e-5)
    assert logged["val/acc1"] == pytest.approx(whole["acc1"], abs=1e-9)
    assert abs(half["loss"] - whole["loss"]) > 1e-4  # so the check above can tell one rank from two


def test_cli_errors_are_one_line_naming_the_fix(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"this is not a checkpoint")
    proc = _run("eval.py", f"ckpt_path={bad}", f"hydra.run.dir={tmp_path / 'eval'}")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "use another .ckpt" in lines[0], proc.stderr


class _MarkSteps(L.Callback):
    def __init__(self, ops: SyncOps):
        self.ops = ops

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.ops.step = batch_idx


@pytest.mark.parametrize("bar", ["throttled", "stock"])
def test_gpu_recipe_training_steps_make_no_host_syncs(tmp_path, bar):
    """A training step of the gpu zoo recipe (mixup/cutmix, fused AdamW; forward, loss, logging, optimiser and
    the progress bar's hooks) asks the device for no number: each would stall a GPU's queue. On the CPU the same
    ops show where a GPU would wait. Lightning itself reads every step's prog_bar metrics, and the stock bar
    needs them: with it the check sees a sync per step; ours reads the step loss once a second."""
    recipe = ["module.mixup.mixup_alpha=0.8", "module.mixup.cutmix_alpha=1.0", "module.optim.fused=true"]
    cfg = compose_config(tmp_path, ["debug=tiny_vit", "data.num_train=320", *recipe])
    datamodule = instantiate(cfg.data)
    module = build_classifier(cfg, datamodule)
    if bar == "stock":  # the step loss logged with prog_bar, read by the stock bar
        log = module.log
        module.log = lambda name, value, **kw: log(
            name, value, **{**kw, "prog_bar": kw.get("prog_bar") or name == "train/loss_step"}
        )
    progress = ThrottledProgressBar(metrics_interval_s=3600) if bar == "throttled" else RichProgressBar()
    ops = SyncOps()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[progress, _MarkSteps(ops)],
    )
    with ops:
        trainer.fit(module, datamodule=datamodule)
    steps = range(1, 19)  # 20 steps; the first reads the bar's metrics once, the last runs into the epoch's end
    per_step = [sum(1 for step, _ in ops.seen if step == s) for s in steps]
    if bar == "throttled":
        assert per_step == [0] * len(steps), ops.seen
        assert set(progress.get_metrics(trainer, module)) >= {"train/loss_step"}  # the bar still shows the loss
    else:
        assert all(n >= 1 for n in per_step) and "_local_scalar_dense" in {name for _, name in ops.seen}


@pytest.mark.parametrize("preset", ["nonlocal_resnet_softmax", "vit_linear"])
def test_channels_last_gives_the_same_logits_and_gradients(tmp_path, preset):
    """module.channels_last is a memory layout, not a different network: logits and loss gradients agree with
    the default layout's."""
    tiny = "debug=tiny_resnet" if preset.startswith("nonlocal") else "debug=tiny_vit"
    cfg = compose_config(tmp_path, [tiny, f"model={preset}"])
    datamodule = instantiate(cfg.data)
    torch.manual_seed(0)
    plain = build_classifier(cfg, datamodule)
    cfg.module.channels_last = True
    nhwc = build_classifier(cfg, datamodule)
    nhwc.load_state_dict(plain.state_dict())
    assert any(
        p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last) and not p.is_contiguous()
        for p in nhwc.parameters()
    )
    x, y = torch.randn(6, 3, 16, 16), torch.randint(0, 10, (6,))
    for module in (plain, nhwc):
        F.cross_entropy(module(x), y).backward()
    torch.testing.assert_close(nhwc(x), plain(x), atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), nhwc.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
    with pytest.raises(ValueError, match="module.channels_last='maybe': Value 'maybe' is not a valid bool"):
        ImageClassifier("vit_cifar", "softmax", num_classes=10, img_size=16, channels_last="maybe")


def test_the_progress_bar_lets_go_of_the_console_before_the_lines_that_end_a_run(tmp_path):
    """The export's line and the closing sentence come in on_fit_end and after: the bar must be stopped by
    then (a line written under a live bar is overwritten, or sits between two copies of the bar)."""
    cfg = compose_config(tmp_path, ["debug=tiny_vit"])
    datamodule = instantiate(cfg.data)
    bar, stopped = ThrottledProgressBar(), []

    class Probe(L.Callback):
        def on_fit_end(self, trainer, pl_module):
            stopped.append(bar._progress_stopped)

    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[Probe(), bar],
    )
    trainer.fit(build_classifier(cfg, datamodule), datamodule=datamodule)
    assert stopped == [True]
    assert bar._get_train_description(0).strip() == "Epoch 1/1"  # counted from 1, as the log lines are
