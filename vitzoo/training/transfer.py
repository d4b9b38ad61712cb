"""Attention transfer: a pretrained softmax ViT or pyramid teaches another mechanism its attention (LoLCATs,
Hedgehog).

Stage 1 (``transfer.stage=1``): the teacher is the softmax network of ``model.init_from`` (a pyramid's own softmax:
PVT's with its spatial reduction, Swin's windows), the student the same weights with the chosen mechanism. Every
student attention layer reads the teacher's input to that layer and learns to give that teacher layer's output: the
MSE per layer, summed over layers (plus, with ``attention_ce``, the cross-entropy between the layers' attention rows,
as Hedgehog trains). One teacher forward pass serves all layers and no labels are used. Only the q/k maps (with their
qk-norms) and the mechanism's own parameters of the converted layers learn (``qk: freeze`` keeps q/k too); every other
tensor stays bit-identical.

Stage 2 (``transfer.stage=2``): the student fine-tunes end to end on the labels like any classifier, starting
from a stage-1 checkpoint (``transfer.student``), optionally with the KL divergence to the teacher's logits at
a temperature (``distill``, ``temperature``). Each stage is a run of its own: checkpoint, export, TensorBoard.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from vitzoo.attention import ZooAttention
from vitzoo.models import initialise_from

from .evaluate import read_checkpoint
from .module import ImageClassifier, build_model
from .options import TransferOptions, options_from

__all__ = ["AttentionTransfer", "initialise", "attention_layers", "converted_blocks"]

QK_MODES = ("train", "freeze")
# Tensors of an attention layer the teacher's weights fix (the output projection, a scale-norm): never trained.
_SHARED = ("in_proj.", "proj.", "q_norm.", "k_norm.", "norm.")
_SAME_NETWORK = ("arch", "attention", "model_kwargs", "num_classes", "img_size", "in_chans")


def attention_layers(model: nn.Module) -> List[ZooAttention]:
    """The attention module of every block, in order (a ViT's blocks, a pyramid's stages one after another)."""
    return [m for m in model.modules() if isinstance(m, ZooAttention)]


def converted_blocks(model: nn.Module, teacher: nn.Module) -> List[int]:
    """The blocks stage 1 teaches: those whose mechanism is not the teacher's (a hybrid stack's softmax blocks, a
    pyramid's unchanged stages keep the teacher's weights), or every block of a student with the teacher's mechanism
    throughout (which then reproduces its teacher)."""
    pairs = list(zip(attention_layers(model), attention_layers(teacher)))
    converted = [i for i, (student, own) in enumerate(pairs) if type(student) is not type(own)]
    return converted or list(range(len(pairs)))


class AttentionTransfer(ImageClassifier):
    """An :class:`ImageClassifier` whose network (``model``, the student) learns from a softmax ``teacher``.

    ``transfer`` keys: ``stage`` (1 | 2), ``qk`` (train | freeze, stage 1), ``attention_ce`` (weight of the
    attention-row cross-entropy, stage 1), ``student`` (stage 2: the stage-1 checkpoint), ``distill`` (weight of
    the KL to the teacher's logits, stage 2) and ``temperature``. The teacher is kept in the checkpoint, so a
    resumed run needs no source; eval, export and the zoo read the student (``model.*``) as from any run.
    """

    def __init__(self, *, transfer: Optional[Mapping[str, Any]] = None, **classifier):
        super().__init__(**classifier)
        self.transfer = _check_transfer(transfer)
        if not attention_layers(self.model) or not hasattr(self.model, "forward_features"):
            raise ValueError(
                f"attention transfer needs a ViT or a pyramid (vitzoo.list_models()), got {self.hparams.arch}"
            )
        self.stage = self.transfer["stage"]
        self.teacher: Optional[nn.Module] = None
        if self.stage == 1 or self.transfer["distill"] > 0:
            self.teacher = build_model({**self.hparams, "attention": "softmax"}).requires_grad_(False)
        self.converted = [] if self.teacher is None else converted_blocks(self.model, self.teacher)
        self._kept_rows: List[Tuple[nn.Parameter, slice, torch.Tensor]] = []
        self.teacher_head_note = ""  # why the teacher's head is not the pretrained one ("" = it is)
        if self.stage == 1:
            self._train_attention_only()

    # -- weights ----------------------------------------------------------------------------------------------
    def initialise(self, init_from: Optional[str]) -> None:
        """Load the weights a new run starts from: stage 1 (and stage 2 without ``student``) the student and the
        teacher from ``init_from``; stage 2 both from the stage-1 checkpoint ``transfer.student``."""
        student = self.transfer["student"]
        if self.stage == 2 and student:
            self._load_stage1(os.fspath(student))
            return
        if not init_from:
            where = "stage 1" if self.stage == 1 else "stage 2 without transfer.student"
            raise ValueError(
                f"attention transfer {where} starts from a pretrained softmax ViT: pass "
                f"init_from=<timm:name.tag | state dict file | export folder>"
            )
        initialise_from(self.model, init_from)
        if self.teacher is not None:
            self.teacher_head_note = initialise_from(self.teacher, init_from).head_note
        self._check_teacher_head()

    def _check_teacher_head(self) -> None:
        if self.transfer["distill"] > 0 and self.teacher_head_note:
            raise ValueError(
                f"transfer.distill needs the teacher's logits over the data's classes, but the teacher's "
                f"head is new ({self.teacher_head_note}); fine-tune a softmax model on the data first and "
                f"start from its export, or set transfer.distill=0"
            )

    def _load_stage1(self, path: str) -> None:
        checkpoint = read_checkpoint(path)
        saved = checkpoint.get("hyper_parameters") or {}
        differ = [
            f"{key}={saved.get(key)!r} (this run: {self.hparams.get(key)!r})"
            for key in _SAME_NETWORK
            if _canonical(saved.get(key)) != _canonical(self.hparams.get(key))
        ]
        if differ or (saved.get("transfer") or {}).get("stage") != 1:
            what = "; ".join(differ) or "it is not a stage-1 checkpoint"
            raise ValueError(
                f"transfer.student={path!r}: {what}; give the stage-1 checkpoint of the same model= and data= options"
            )
        state = checkpoint["state_dict"]
        self.model.load_state_dict({k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")})
        if self.teacher is not None:
            self.teacher.load_state_dict(
                {k[len("teacher.") :]: v for k, v in state.items() if k.startswith("teacher.")}
            )
        self.teacher_head_note = checkpoint.get("teacher_head_note", "")
        self._check_teacher_head()

    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["teacher_head_note"] = self.teacher_head_note

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        saved = (checkpoint.get("hyper_parameters") or {}).get("transfer") or {}
        if saved.get("stage") != self.stage:
            raise ValueError(
                f"the checkpoint is of transfer stage {saved.get('stage')}, this run stage {self.stage}; "
                f"resume with the transfer.stage it was trained with"
            )
        self.teacher_head_note = checkpoint.get("teacher_head_note", "")
        super().on_load_checkpoint(checkpoint)

    # -- stage 1: what learns ---------------------------------------------------------------------------------
    def _train_attention_only(self) -> None:
        """requires_grad on the q/k maps (unless ``qk: freeze``) and the mechanism's own parameters only; the
        v rows of a fused input projection learn nothing (put back after every step, see ``optimizer_step``)."""
        self.model.requires_grad_(False)
        layers = attention_layers(self.model)
        for attn in (layers[i] for i in self.converted):  # softmax blocks of a hybrid stay the teacher's
            own = [p for name, p in attn.named_parameters() if not name.startswith(_SHARED)]
            if self.transfer["qk"] == "freeze" and not own:
                raise ValueError(
                    f"transfer.qk=freeze: {type(attn).__name__} has no parameters of its own, so nothing "
                    f"would learn; use transfer.qk=train"
                )
            for p in own:
                p.requires_grad_(True)
            if self.transfer["qk"] == "train" and "q" in attn.projections:
                for norm in (attn.q_norm, attn.k_norm):
                    norm.requires_grad_(True)
                self._train_qk_rows(attn)

    def _train_qk_rows(self, attn: ZooAttention) -> None:
        proj, head_weight = attn.in_proj.proj, attn.in_proj.head_weight
        outputs = len(attn.projections)
        v = attn.projections.index("v")
        for tensor in (proj.weight, proj.bias, head_weight):
            if tensor is None:
                continue
            tensor.requires_grad_(True)
            width = tensor.shape[0] // outputs if tensor is not head_weight else 1
            self._kept_rows.append((tensor, slice(v * width, (v + 1) * width), torch.empty(0)))

    def on_train_start(self) -> None:
        super().on_train_start()  # a resumed run's weights are in place by now: keep these rows
        self._kept_rows = [(p, rows, p.detach()[rows].clone()) for p, rows, _ in self._kept_rows]

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        with torch.no_grad():
            for tensor, rows, kept in self._kept_rows:
                tensor[rows] = kept

    # -- stage 1: the loss ------------------------------------------------------------------------------------
    def transfer_losses(self, images: torch.Tensor) -> Dict[str, torch.Tensor]:
        """{``block<i>``: MSE between the student's and the teacher's attention output (+ ``attention_ce`` x the
        row cross-entropy)} for every converted block, each student layer fed the teacher's input to that layer."""
        teachers, students = attention_layers(self.teacher), attention_layers(self.model)
        seen: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        hooks = [
            layer.register_forward_hook(lambda m, args, out, i=i: seen.__setitem__(i, (args[0], out)))
            for i, layer in enumerate(teachers)
        ]
        try:
            with torch.no_grad(), _eval_mode(self.teacher):
                self.teacher.forward_features(images)
        finally:
            for hook in hooks:
                hook.remove()
        weight, losses = self.transfer["attention_ce"], {}
        for i in self.converted:
            (x, target), student, teacher = seen[i], students[i], teachers[i]
            student.token_grid = teacher.token_grid
            loss = F.mse_loss(student(x).float(), target.float())
            if weight > 0:
                loss = loss + weight * _row_cross_entropy(student, teacher, x)
            losses[f"block{i}"] = loss
        return losses

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        if self.stage == 2:
            return self._fine_tune_step(batch, batch_idx)
        losses = self.transfer_losses(batch[0])
        loss = torch.stack(list(losses.values())).sum()
        self.log("train/loss_step", loss, on_step=True, on_epoch=False)
        self.log("train/transfer_loss", loss, on_step=False, on_epoch=True)
        self.log_dict({f"train/transfer/{name}": value for name, value in losses.items()}, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        if self.stage == 1:
            losses = self.transfer_losses(batch[0])
            self.log(
                "val/transfer_loss", torch.stack(list(losses.values())).sum(), on_epoch=True, batch_size=len(batch[0])
            )
            self.log_dict(
                {f"val/transfer/{name}": value for name, value in losses.items()},
                on_epoch=True,
                batch_size=len(batch[0]),
            )

    # -- stage 2 ----------------------------------------------------------------------------------------------
    def _fine_tune_step(self, batch, batch_idx: int) -> torch.Tensor:
        """The classifier's step; with ``distill``, plus KL(teacher || student) on the images the student saw
        (mixed, when mixup is on), both at ``temperature``, times temperature^2 (Hinton et al.)."""
        if self.transfer["distill"] <= 0:
            return super().training_step(batch, batch_idx)
        seen: List[Tuple[torch.Tensor, torch.Tensor]] = []
        hook = self.model.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
        try:
            loss = super().training_step(batch, batch_idx)
        finally:
            hook.remove()
        images, logits = seen[-1]
        with torch.no_grad(), _eval_mode(self.teacher):
            target = self.teacher(images)
        t = self.transfer["temperature"]
        kl = (
            F.kl_div(
                F.log_softmax(logits.float() / t, dim=-1),
                F.log_softmax(target.float() / t, dim=-1),
                log_target=True,
                reduction="batchmean",
            )
            * t
            * t
        )
        self.log("train/distill", kl, on_step=False, on_epoch=True)
        return loss + self.transfer["distill"] * kl


@contextmanager
def _eval_mode(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode for the block (the teacher: no drop-path or dropout), then as it was."""
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


def _row_cross_entropy(student: ZooAttention, teacher: ZooAttention, x: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -sum_j p_teacher(j) log p_student(j), every query's attention row (Hedgehog's loss)."""
    rows = torch.arange(x.shape[1], device=x.device)
    with torch.no_grad():
        q, k, _ = teacher.project(x)
        target = teacher.probs(x, q, k, None, False, rows)
    q, k, _ = student.project(x)
    probs = student.probs(x, q, k, None, False, rows).float()
    return -(target.float() * probs.clamp_min(1e-12).log()).sum(-1).mean()


def _check_transfer(given: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    options = dataclasses.asdict(options_from(TransferOptions, "transfer", given))
    if options["stage"] not in (1, 2):
        raise ValueError(
            f"transfer.stage={options['stage']!r}; give 1 (attention layers learn the teacher's outputs) "
            f"or 2 (fine-tune on the labels)"
        )
    if options["qk"] not in QK_MODES:
        raise ValueError(f"transfer.qk={options['qk']!r}; choose one of {list(QK_MODES)}")
    for key in ("attention_ce", "distill", "temperature"):
        if not isinstance(options[key], (int, float)) or isinstance(options[key], bool) or options[key] < 0:
            raise ValueError(f"transfer.{key}={options[key]!r}; give a number >= 0")
    if options["temperature"] <= 0:
        raise ValueError(f"transfer.temperature={options['temperature']!r}; give a number > 0")
    return options


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def initialise(module: ImageClassifier, init_from: Optional[str]) -> None:
    """Load what a new run starts from (never a resumed one: its checkpoint holds the weights)."""
    if isinstance(module, AttentionTransfer):
        module.initialise(init_from)
    elif init_from:
        initialise_from(module.model, init_from)
