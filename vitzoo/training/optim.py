"""AdamW (no weight decay on biases, norms and tokens) with a per-step warmup + cosine schedule."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2

__all__ = ["warmup_cosine", "scaled_lr", "build_optimizer", "build_scheduler"]


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> float:
    """LR factor: linear from 1/(warmup+1) to 1 over ``warmup_steps``, then cosine down to
    ``min_lr_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def scaled_lr(lr: float, global_batch: int, base_batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017, DeiT's ``lr x batch / 512``): ``lr`` is the peak LR at a global
    batch of ``base_batch`` images; a run of ``global_batch`` gets ``lr * global_batch / base_batch``."""
    if isinstance(base_batch, bool) or not isinstance(base_batch, int) or base_batch < 1:
        raise ValueError(
            f"module.optim.lr_base_batch={base_batch!r}; give a positive integer (DeiT: 512) or null "
            f"to use module.optim.lr as it is"
        )
    return lr * global_batch / base_batch


def build_optimizer(
    model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.999), layer_decay=None, fused=None
) -> torch.optim.Optimizer:
    """timm's AdamW param groups: 1-D params and ``model.no_weight_decay()`` get no decay. ``fused``: torch's
    fused AdamW kernel (one launch for all parameters; None = torch's default, the foreach path)."""
    extra = {} if fused is None else {"fused": bool(fused)}
    return create_optimizer_v2(
        model, opt="adamw", lr=lr, weight_decay=weight_decay, betas=tuple(betas), layer_decay=layer_decay, **extra
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, min_lr_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over :func:`warmup_cosine`; step it once per optimizer step."""

    def factor(step: int) -> float:
        return warmup_cosine(step, total_steps, warmup_steps, min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
