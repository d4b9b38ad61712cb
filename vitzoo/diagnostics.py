"""Look inside attention without editing the model: attention maps and their entropy (docs/mechanisms.md section 6).

Every zoo mechanism can state its (implied) attention matrix; for kernel forms it is built for a
subsample of queries only, so this stays cheap at high resolution.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

import torch
import torch.nn as nn

from vitzoo.attention import ZooAttention

__all__ = ["capture_attention", "attention_entropy", "row_entropy"]


def _query_index(num_queries: int, max_queries: Optional[int], device) -> torch.Tensor:
    """All queries, or ``max_queries`` evenly spaced ones (deterministic)."""
    if max_queries is None or num_queries <= max_queries:
        return torch.arange(num_queries, device=device)
    return torch.linspace(0, num_queries - 1, max_queries, device=device).round().long()


@contextmanager
def capture_attention(model: nn.Module, max_queries: Optional[int] = None) -> Iterator[Dict[str, torch.Tensor]]:
    """Record each attention layer's noiseless matrix (B, H, Q, N) during forwards in the block.

    >>> with capture_attention(model, max_queries=64) as maps:
    ...     model(images)
    >>> maps["blocks.0.attn"].shape
    """
    maps: Dict[str, torch.Tensor] = {}
    layers = {name: m for name, m in model.named_modules() if isinstance(m, ZooAttention)}

    def probe_for(name):
        def probe(module, probs_of, num_tokens):
            with torch.no_grad():
                maps[name] = probs_of(_query_index(num_tokens, max_queries, next(module.parameters()).device))

        return probe

    for name, layer in layers.items():
        layer.attention_probe = probe_for(name)
    try:
        yield maps
    finally:
        for layer in layers.values():
            layer.attention_probe = None


def row_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy H = -sum p log p of each row of ``probs`` (last dim), normalised by log n; NaN for a
    row that attends nothing (mass < 0.5: a relu query with no positive feature gives an all-zero row,
    which is no distribution, not a one-hot one)."""
    n = probs.shape[-1]
    p = probs.double()
    empty = p.sum(dim=-1) < 0.5
    if n < 2:
        return torch.ones(probs.shape[:-1], dtype=p.dtype, device=probs.device).masked_fill(empty, math.nan)
    return (-(torch.special.xlogy(p, p).sum(dim=-1)) / math.log(n)).masked_fill(empty, math.nan)


@torch.no_grad()
def attention_entropy(model: nn.Module, images: torch.Tensor, max_queries: Optional[int] = 256) -> Dict[str, float]:
    """Mean normalised entropy H / log n of every attention layer's rows for ``images``.

    1 = uniform attention, 0 = one-hot; rows that attend nothing are left out of the mean (NaN when
    every row of a layer does). The model runs in eval mode (no noise, no dropout) and is put back in
    its previous mode afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        with capture_attention(model, max_queries) as maps:
            model(images)
    finally:
        model.train(was_training)
    if not maps:
        raise ValueError(f"{type(model).__name__} has no vitzoo attention layers; build it with vitzoo.create_model")
    return {name: float(row_entropy(p).nanmean()) for name, p in maps.items()}
