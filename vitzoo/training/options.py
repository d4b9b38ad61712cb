"""The classifier's option groups as dataclasses: where their defaults and types are written, the argument types
of :class:`~vitzoo.training.ImageClassifier` (which also takes a mapping of their fields, as Hydra gives it;
configs/module/default.yaml spells the same values for the command line, and a test keeps the two equal)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Type, TypeVar, Union

from vitzoo.options import reject_unknown

__all__ = ["OptimOptions", "MixupOptions", "TransferOptions", "options_from"]

T = TypeVar("T")


@dataclass(frozen=True)
class OptimOptions:
    """AdamW with a per-step warmup + cosine schedule (:mod:`vitzoo.training.optim`)."""

    lr: float = 1e-3  # peak LR, reached after warmup; cosine to lr * min_lr_ratio
    weight_decay: float = 0.05  # not applied to biases, norms, pos_embed / cls_token
    betas: List[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.01
    layer_decay: Optional[float] = None  # e.g. 0.75 for layer-wise LR decay (ViT fine-tuning)
    fused: Optional[bool] = None  # torch's fused AdamW kernel; None: torch's default
    lr_base_batch: Optional[int] = None  # lr is the LR at this global batch, scaled linearly to the run's (DeiT)


@dataclass(frozen=True)
class MixupOptions:
    """timm's ``Mixup`` arguments; mixing is on when ``mixup_alpha`` or ``cutmix_alpha`` is > 0."""

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: Optional[List[float]] = None
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"

    @property
    def active(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0


@dataclass(frozen=True)
class TransferOptions:
    """Attention transfer (:class:`~vitzoo.training.transfer.AttentionTransfer`)."""

    stage: int = 1  # 1: the attention layers learn the teacher's outputs (no labels) | 2: fine-tune on the labels
    qk: str = "train"  # stage 1: train | freeze the q/k maps
    attention_ce: float = 0.0  # stage 1: weight of the cross-entropy between attention rows (Hedgehog's loss)
    student: Optional[str] = None  # stage 2: the stage-1 checkpoint; None = student and teacher from init_from
    distill: float = 0.0  # stage 2: weight of KL(teacher || student) on the logits
    temperature: float = 1.0  # stage 2: the distillation's softmax temperature


def options_from(cls: Type[T], name: str, given: Union[T, Mapping[str, Any], None]) -> T:
    """``given`` (an instance, a mapping of field values, or None for the defaults) as ``cls``: an unknown key, or
    a non-number for a number field, is a one-line ``ValueError`` naming ``name`` and the valid options."""
    if isinstance(given, cls):
        return given
    given = dict(given or {})
    reject_unknown(name, given, [f.name for f in dataclasses.fields(cls)])
    hints = typing.get_type_hints(cls)
    for key, value in given.items():
        if hints[key] is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{name}.{key} must be a number, got {value!r}")
    return cls(**given)
