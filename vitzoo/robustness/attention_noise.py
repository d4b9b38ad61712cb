"""Gaussian attention-logit noise at evaluation time, for every layer of a model (docs/mechanisms.md section 6)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch.nn as nn

from vitzoo.attention import ZooAttention

__all__ = ["attention_noise"]


@contextmanager
def attention_noise(model: nn.Module, sigma: float) -> Iterator[nn.Module]:
    """Inside the block, every zoo attention layer adds N(0, sigma^2) noise to its logits in eval
    mode (kernel forms: the per-key factor exp(eps_j)). sigma = 0 is exactly the clean model.

    >>> with attention_noise(model, sigma=1.0):
    ...     logits = model(images)
    """
    if sigma < 0:
        raise ValueError(f"sigma is a standard deviation and must be >= 0, got {sigma}")
    layers = [m for m in model.modules() if isinstance(m, ZooAttention)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no vitzoo attention layers; build it with vitzoo.create_model")
    saved = [m.eval_logit_noise for m in layers]
    for m in layers:
        m.eval_logit_noise = float(sigma)
    try:
        yield model
    finally:
        for m, s in zip(layers, saved):
            m.eval_logit_noise = s
